//! The shared-memory all-reduce: k ranks as threads of this test process, each with its own mapping of one
//! memfd (as rank processes would have), joined through the real rendezvous on loopback.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use ringtrain_worker::collective::CommError;
use ringtrain_worker::{Collective, ShmCollective, ShmSegment};
use support::{config, free_address, input};

/// Runs `body` on k ranks sharing one segment of `slot_elems` floats per slot; what each returned.
fn on_shm<T: Send + 'static>(
    world: usize,
    slot_elems: usize,
    io_timeout: Duration,
    body: impl Fn(&mut ShmCollective) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let address = free_address();
    let segment = ShmSegment::create(world, slot_elems).unwrap();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            let mine = segment.share().unwrap();
            thread::spawn(move || {
                let mut shm = ShmCollective::connect(&config(address, rank, world, io_timeout), mine).unwrap();
                body(&mut shm)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn sums_and_broadcasts_are_exact_for_every_world_length_and_round_count() {
    for world in 2..=4usize {
        // a slot of 5 floats: a length of 1009 takes 202 rounds through both sets of slots
        for len in [0, 1, world - 1, 7, 1009] {
            let results = on_shm(world, 5, Duration::from_secs(20), move |shm| {
                let mut sum = input(shm.rank(), len);
                shm.all_reduce_sum(&mut sum).unwrap();
                let mut copy = if shm.rank() == 1 { input(7, len) } else { vec![0.0; len] };
                shm.broadcast(&mut copy, 1).unwrap();
                // a second all-reduce straight after: the rounds' alternation carries across calls
                let mut again = vec![shm.rank() as f32 + 1.0; len];
                shm.all_reduce_sum(&mut again).unwrap();
                (sum, copy, again)
            });
            let expected: Vec<f32> = (0..len).map(|i| (0..world).map(|r| input(r, len)[i]).sum()).collect();
            let triangle = (world * (world + 1) / 2) as f32;
            for (rank, (sum, copy, again)) in results.iter().enumerate() {
                assert_eq!(sum, &expected, "world {world}, len {len}, rank {rank}");
                assert_eq!(copy, &input(7, len), "broadcast: world {world}, len {len}, rank {rank}");
                assert!(again.iter().all(|&x| x == triangle), "world {world}, len {len}, rank {rank}");
            }
        }
    }
}

/// The same sums as the TCP ring would give, bit for bit, where every rank's values are exact (and every
/// rank ends with identical bits where they are not: one rank sums each chunk and the others copy it).
#[test]
fn every_rank_ends_with_the_same_bits() {
    let len = 100_003;
    let results = on_shm(3, 4096, Duration::from_secs(20), move |shm| {
        let r = shm.rank() as f32;
        let mut buf: Vec<f32> = (0..len).map(|i| ((i as f32) * 0.37 + r).sin() / (r + 1.3)).collect();
        shm.all_reduce_sum(&mut buf).unwrap();
        buf
    });
    for other in &results[1..] {
        assert!(results[0].iter().zip(other).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn a_peer_that_dies_is_an_error_naming_it_not_a_hang() {
    let world = 3;
    let started = Instant::now();
    let results = on_shm(world, 64, Duration::from_secs(30), move |shm| -> Result<(), CommError> {
        let mut buf = vec![1.0f32; 1000];
        shm.all_reduce_sum(&mut buf)?;
        if shm.rank() == 1 {
            return Ok(()); // "dies": its ring links close with it, and it never reaches the next barrier
        }
        loop {
            shm.all_reduce_sum(&mut buf)?;
        }
    });
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    for rank in [0, 2] {
        let err = results[rank].as_ref().expect_err("the survivors must fail");
        assert!(err.to_string().contains("rank "), "rank {rank}: {err}");
    }
    let named = results.iter().filter_map(|r| r.as_ref().err()).any(|e| e.to_string().contains("rank 1 "));
    assert!(named, "someone should name rank 1: {results:?}");
}

#[test]
fn a_stalled_peer_times_out_with_its_rank() {
    let results = on_shm(2, 64, Duration::from_millis(500), move |shm| {
        if shm.rank() == 1 {
            thread::sleep(Duration::from_secs(2)); // alive (links open) but not at the barrier
            return None;
        }
        let mut buf = vec![1.0f32; 100];
        Some(shm.all_reduce_sum(&mut buf).unwrap_err().to_string())
    });
    let said = results[0].clone().unwrap();
    assert!(said.contains("rank 1 sent nothing"), "{said}");
}

#[test]
fn a_segment_for_another_world_is_refused() {
    let segment = ShmSegment::create(2, 16).unwrap();
    assert_eq!(segment.slot_elems(), 16);
    let err = ShmCollective::connect(&config(free_address(), 0, 3, Duration::from_secs(1)), segment).unwrap_err();
    assert!(err.to_string().contains("for 2 ranks, the job has 3"), "{err}");
}

/// A rank that waits at a barrier for a slower one sleeps (a futex the slower rank wakes) instead of keeping
/// a core busy: over a 600 ms wait it uses a few milliseconds of CPU, and the sum is still right.
#[test]
fn a_rank_waiting_for_a_slow_one_sleeps() {
    let results = on_shm(2, 64, Duration::from_secs(20), move |shm| {
        if shm.rank() == 1 {
            thread::sleep(Duration::from_millis(600)); // busy elsewhere: its backward, say
        }
        let cpu_before = thread_cpu_time();
        let mut buf = vec![1.0f32; 100];
        shm.all_reduce_sum(&mut buf).unwrap();
        (thread_cpu_time() - cpu_before, buf[0])
    });
    let (waited_cpu, sum) = results[0];
    assert_eq!(sum, 2.0);
    assert!(waited_cpu < Duration::from_millis(100), "rank 0 burned {waited_cpu:?} of CPU waiting");
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec, a local.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now)
    };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}
