//! The TCP ring over real sockets on loopback: k ranks as threads of this test process.

mod support;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use ringtrain_worker::collective::CommError;
use ringtrain_worker::{Collective, RendezvousConfig, RingCollective};
use support::{config, free_address, input};

/// Runs `body` on k connected ranks (threads) and returns what each returned, in rank order.
fn on_ring<T: Send + 'static>(
    world: usize,
    segment_elems: Option<usize>,
    body: impl Fn(&mut RingCollective) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let address = free_address();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            thread::spawn(move || {
                let mut ring = RingCollective::connect(&config(address, rank, world, Duration::from_secs(20))).unwrap();
                if let Some(seg) = segment_elems {
                    ring = ring.with_segment_elems(seg);
                }
                body(&mut ring)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn sums_are_exact_for_every_world_and_awkward_lengths() {
    for world in 1..=5usize {
        for len in [0, 1, world.saturating_sub(1), 7, 1009] {
            let results = on_ring(world, Some(3), move |ring| {
                let mut buf = input(ring.rank(), len);
                ring.all_reduce_sum(&mut buf).unwrap();
                buf
            });
            let expected: Vec<f32> = (0..len).map(|i| (0..world).map(|r| input(r, len)[i]).sum()).collect();
            for (rank, got) in results.iter().enumerate() {
                assert_eq!(got, &expected, "world {world}, len {len}, rank {rank}");
            }
        }
    }
}

#[test]
fn ten_million_elements_and_the_bandwidth_optimal_volume() {
    const LEN: usize = 10_000_000;
    let world = 4;
    let results = on_ring(world, None, |ring| {
        let mut buf = vec![ring.rank() as f32 + 1.0; LEN];
        ring.all_reduce_sum(&mut buf).unwrap();
        (buf.iter().all(|&x| x == 10.0), ring.bytes_sent())
    });
    for (rank, (correct, sent)) in results.into_iter().enumerate() {
        assert!(correct, "rank {rank} has a wrong sum");
        // 2(k-1) chunks of len/k elements each: 2(k-1)/k of the buffer
        let bound = 2 * (world - 1) * (LEN / world) * 4;
        assert_eq!(sent as usize, bound, "rank {rank} sent {sent} bytes, the bound is {bound}");
    }
}

#[test]
fn broadcast_and_barrier_reach_every_rank() {
    for world in [1, 2, 5] {
        let results = on_ring(world, Some(4), |ring| {
            let mut buf = if ring.rank() == 1 % ring.world_size() { vec![3.5f32; 11] } else { vec![0.0; 11] };
            ring.broadcast(&mut buf, 1 % ring.world_size()).unwrap();
            ring.barrier().unwrap();
            buf
        });
        for got in results {
            assert_eq!(got, vec![3.5f32; 11]);
        }
    }
}

#[test]
fn a_peer_that_dies_is_an_error_naming_it_not_a_hang() {
    let address = free_address();
    let world = 3;
    let started = Instant::now();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            thread::spawn(move || -> Result<(), CommError> {
                let mut ring = RingCollective::connect(&config(address, rank, world, Duration::from_secs(30)))?;
                let mut buf = vec![1.0f32; 1000];
                ring.all_reduce_sum(&mut buf)?;
                if rank == 1 {
                    return Ok(()); // "dies": its sockets close with the ring
                }
                loop {
                    ring.all_reduce_sum(&mut buf)?;
                }
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    for rank in [0, 2] {
        let err = results[rank].as_ref().expect_err("the survivors must fail");
        assert!(err.to_string().contains("rank "), "rank {rank}: {err}");
    }
    let named_dead_peer = results.iter().filter_map(|r| r.as_ref().err()).any(|e| e.to_string().contains("rank 1 "));
    assert!(named_dead_peer, "someone should name rank 1: {results:?}");
}

#[test]
fn a_stalled_peer_times_out_with_its_rank() {
    let address = free_address();
    let world = 2;
    let timeout = Duration::from_millis(800);
    let stalled = thread::spawn(move || {
        let ring = RingCollective::connect(&config(address, 1, world, timeout)).unwrap();
        thread::sleep(Duration::from_secs(4)); // connected but silent
        drop(ring);
    });
    let mut ring = RingCollective::connect(&config(address, 0, world, timeout)).unwrap();
    let started = Instant::now();
    let err = ring.all_reduce_sum(&mut [1.0f32; 10]).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "timed out after {:?}", started.elapsed());
    assert!(matches!(err, CommError::PeerTimedOut { peer: 1, .. }), "{err}");
    stalled.join().unwrap();
}

#[test]
fn a_missing_rank_fails_the_rendezvous_by_number() {
    let address = free_address();
    let mut cfg = config(address, 0, 3, Duration::from_secs(1));
    cfg.join_timeout = Duration::from_millis(500);
    let err = RingCollective::connect(&cfg).unwrap_err();
    assert!(err.to_string().contains("rank 1, rank 2 did not join"), "{err}");
}

/// Rank 0 handed a socket already bound to the rendezvous port (as an agent hands it) accepts on it: the
/// port is held from the moment it was chosen, so binding it again (what rank 0 did before, and what
/// another process could have beaten it to) would fail here, and the ring still forms.
#[test]
fn rank_0_accepts_on_the_socket_it_was_handed() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = held.local_addr().unwrap();
    assert!(std::net::TcpListener::bind(address).is_err(), "the port is held");
    ringtrain_worker::collective::listen_on(held);
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            thread::spawn(move || {
                let mut ring = RingCollective::connect(&config(address, rank, 3, Duration::from_secs(20))).unwrap();
                let mut buf = input(rank, 1000);
                ring.all_reduce_sum(&mut buf).unwrap();
                buf
            })
        })
        .collect();
    let sums: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let expected: Vec<f32> = (0..1000).map(|i| (0..3).map(|r| input(r, 1000)[i]).sum()).collect();
    assert!(sums.iter().all(|s| *s == expected), "every rank has the sum");
}

fn with_secret(address: SocketAddr, rank: usize, world: usize, secret: &str) -> RendezvousConfig {
    RendezvousConfig { secret: Some(secret.to_string()), ..config(address, rank, world, Duration::from_secs(20)) }
}

/// With a placement secret, a stranger's garbage and an impostor with a wrong secret are dropped; the real
/// ranks still form the ring and sum correctly, and the impostor learns nothing (no address table).
#[test]
fn strangers_and_wrong_secrets_are_dropped_and_the_ring_still_forms() {
    use std::io::Write;
    let address = free_address();
    let world = 3;
    let rank0 = thread::spawn(move || {
        let mut ring = RingCollective::connect(&with_secret(address, 0, world, "placement-secret")).unwrap();
        let mut buf = vec![1.0f32; 1000];
        ring.all_reduce_sum(&mut buf).unwrap();
        buf
    });
    thread::sleep(Duration::from_millis(200));
    // a port scanner, then garbage
    drop(std::net::TcpStream::connect(address).unwrap());
    let mut junk = std::net::TcpStream::connect(address).unwrap();
    junk.write_all(b"garbage\n").unwrap();
    // an impostor claiming rank 1 with the wrong secret gets no table
    let mut impostor = with_secret(address, 1, world, "guessed");
    impostor.join_timeout = Duration::from_secs(3);
    let refused = RingCollective::connect(&impostor).unwrap_err();
    assert!(refused.to_string().contains("address table"), "{refused}");
    // the real ranks join and the ring works
    let others: Vec<_> = (1..world)
        .map(|rank| {
            thread::spawn(move || {
                let mut ring = RingCollective::connect(&with_secret(address, rank, world, "placement-secret")).unwrap();
                let mut buf = vec![1.0f32; 1000];
                ring.all_reduce_sum(&mut buf).unwrap();
                buf
            })
        })
        .collect();
    assert_eq!(rank0.join().unwrap(), vec![3.0; 1000]);
    for other in others {
        assert_eq!(other.join().unwrap(), vec![3.0; 1000]);
    }
}

/// A rank with the wrong secret cannot reach the others' ring either: rank 0 never lists it, so the
/// rendezvous ends with the real rank missing, named.
#[test]
fn a_whole_placement_with_mismatched_secrets_fails_naming_the_rank() {
    let address = free_address();
    let rank0 = thread::spawn(move || {
        let mut cfg = with_secret(address, 0, 2, "right");
        cfg.join_timeout = Duration::from_secs(2);
        RingCollective::connect(&cfg).map(|_| ())
    });
    thread::sleep(Duration::from_millis(100));
    let mut wrong = with_secret(address, 1, 2, "wrong");
    wrong.join_timeout = Duration::from_secs(2);
    assert!(RingCollective::connect(&wrong).is_err());
    let err = rank0.join().unwrap().unwrap_err();
    assert!(err.to_string().contains("rank 1 did not join"), "{err}");
}
