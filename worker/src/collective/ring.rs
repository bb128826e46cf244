//! The bandwidth-optimal ring all-reduce over TCP (Patarasuk & Yuan 2009; the algorithm of NCCL's ring and
//! Horovod): the buffer is cut into k chunks; k-1 reduce-scatter steps leave each rank with one fully summed
//! chunk, k-1 all-gather steps hand every summed chunk round. Each step sends one chunk to the right
//! neighbour while receiving one from the left (two threads: full duplex), in segments, so the receiver sums
//! a segment while the next is still on the wire. Every rank sends 2(k-1)/k of the buffer, the lower bound.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::Duration;

use super::rendezvous::{connect_ring, RendezvousConfig, RingLinks};
use super::{Collective, CommError, CommResult};

/// Elements per segment: large enough to amortise system calls, small enough to overlap send and receive.
pub const DEFAULT_SEGMENT_ELEMS: usize = 64 * 1024;

#[derive(Debug)]
pub struct RingCollective {
    rank: usize,
    world: usize,
    /// None when the world has one rank.
    links: Option<(TcpStream, TcpStream)>,
    io_timeout: Duration,
    segment_elems: usize,
    scratch: Vec<f32>,
    bytes_sent: u64,
}

#[derive(Debug, Clone, Copy)]
enum Combine {
    Add,
    Copy,
}

impl RingCollective {
    /// Joins the ring of `config.world` ranks (a world of one needs no sockets).
    pub fn connect(config: &RendezvousConfig) -> CommResult<RingCollective> {
        let links = if config.world > 1 { Some(connect_ring(config)?) } else { None };
        Ok(RingCollective::over(config.rank, config.world, links, config.io_timeout))
    }

    /// The ring of `world` ranks, this one at place `rank`, over links a rendezvous made (None: a world of
    /// one). A pipelined job's ranks of one stage form such a ring among the job's others.
    pub fn over(rank: usize, world: usize, links: Option<RingLinks>, io_timeout: Duration) -> RingCollective {
        RingCollective {
            rank,
            world,
            links: links.map(|l| (l.left, l.right)),
            io_timeout,
            segment_elems: DEFAULT_SEGMENT_ELEMS,
            scratch: vec![0.0; DEFAULT_SEGMENT_ELEMS],
            bytes_sent: 0,
        }
    }

    pub fn with_segment_elems(mut self, elems: usize) -> Self {
        self.segment_elems = elems.max(1);
        self.scratch = vec![0.0; self.segment_elems];
        self
    }

    /// A neighbour whose connection is closed (it died), found without blocking: the idle ring links double
    /// as a liveness probe when a device collective fails, so the error can name the dead rank.
    pub fn closed_neighbour(&self) -> Option<usize> {
        let (left, right) = self.links.as_ref()?;
        [(left, self.left_rank()), (right, self.right_rank())].into_iter().find_map(|(link, peer)| {
            link.set_nonblocking(true).ok()?;
            let mut byte = [0u8; 1];
            let closed = match link.peek(&mut byte) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != ErrorKind::WouldBlock,
            };
            let _ = link.set_nonblocking(false);
            closed.then_some(peer)
        })
    }

    fn left_rank(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn right_rank(&self) -> usize {
        (self.rank + 1) % self.world
    }

    /// Chunk i of a buffer of `len`: balanced, so any length works (chunks differ by at most one element).
    fn chunk(&self, len: usize, i: usize) -> Range<usize> {
        let k = self.world;
        i * len / k..(i + 1) * len / k
    }

    /// One ring step: send `send` to the right while receiving `recv` from the left and combining it.
    fn exchange(
        &mut self,
        buf: &mut [f32],
        send: Range<usize>,
        recv: Range<usize>,
        combine: Combine,
    ) -> CommResult<()> {
        let (left_rank, right_rank, timeout, seg) =
            (self.left_rank(), self.right_rank(), self.io_timeout, self.segment_elems);
        let (outgoing, incoming) = disjoint(buf, send, recv);
        let Some((left, right)) = self.links.as_mut() else { return Ok(()) };
        let scratch = &mut self.scratch;
        let sent = std::thread::scope(|scope| {
            let sender = scope.spawn(move || -> CommResult<u64> {
                for segment in outgoing.chunks(seg) {
                    right.write_all(bytemuck::cast_slice(segment)).map_err(|e| io_error(right_rank, timeout, e))?;
                }
                Ok(std::mem::size_of_val(outgoing) as u64)
            });
            let received =
                receive_into(left, incoming, scratch, seg, combine).map_err(|e| io_error(left_rank, timeout, e));
            let sent = sender.join().unwrap_or_else(|_| {
                Err(CommError::Io { peer: right_rank, source: std::io::Error::other("sender thread panicked") })
            });
            received.and(sent)
        })?;
        self.bytes_sent += sent;
        Ok(())
    }
}

fn receive_into(
    left: &mut TcpStream,
    incoming: &mut [f32],
    scratch: &mut [f32],
    seg: usize,
    combine: Combine,
) -> std::io::Result<()> {
    for target in incoming.chunks_mut(seg) {
        let data = &mut scratch[..target.len()];
        left.read_exact(bytemuck::cast_slice_mut(data))?;
        match combine {
            Combine::Add => target.iter_mut().zip(data.iter()).for_each(|(t, d)| *t += d),
            Combine::Copy => target.copy_from_slice(data),
        }
    }
    Ok(())
}

/// Borrows two disjoint ranges of one buffer, one shared and one mutable.
fn disjoint(buf: &mut [f32], shared: Range<usize>, exclusive: Range<usize>) -> (&[f32], &mut [f32]) {
    if shared.start >= exclusive.end {
        let (head, tail) = buf.split_at_mut(shared.start);
        (&tail[..shared.len()], &mut head[exclusive])
    } else {
        let (head, tail) = buf.split_at_mut(exclusive.start);
        (&head[shared], &mut tail[..exclusive.len()])
    }
}

fn io_error(peer: usize, timeout: Duration, e: std::io::Error) -> CommError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::PeerTimedOut { peer, timeout },
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::NotConnected => CommError::PeerClosed { peer, detail: e.to_string() },
        _ => CommError::Io { peer, source: e },
    }
}

impl Collective for RingCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> CommResult<()> {
        let (k, r, len) = (self.world, self.rank, buf.len());
        if k == 1 || len == 0 {
            return Ok(());
        }
        // reduce-scatter: after step s, chunk (r - s - 1) holds the sum over s + 2 ranks
        for s in 0..k - 1 {
            let send = self.chunk(len, (r + k - s) % k);
            let recv = self.chunk(len, (r + 2 * k - s - 1) % k);
            self.exchange(buf, send, recv, Combine::Add)?;
        }
        // all-gather: rank r now owns the full sum of chunk (r + 1); pass the sums round
        for s in 0..k - 1 {
            let send = self.chunk(len, (r + 1 + k - s) % k);
            let recv = self.chunk(len, (r + k - s) % k);
            self.exchange(buf, send, recv, Combine::Copy)?;
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> CommResult<()> {
        let (k, r) = (self.world, self.rank);
        if k == 1 || buf.is_empty() {
            return Ok(());
        }
        let (left_rank, right_rank, timeout, seg) =
            (self.left_rank(), self.right_rank(), self.io_timeout, self.segment_elems);
        let forwards = right_rank != root;
        let Some((left, right)) = self.links.as_mut() else { return Ok(()) };
        // a pipeline root -> root+1 -> ... -> root-1, segment by segment
        for segment in buf.chunks_mut(seg) {
            if r != root {
                left.read_exact(bytemuck::cast_slice_mut(segment)).map_err(|e| io_error(left_rank, timeout, e))?;
            }
            if r == root || forwards {
                right.write_all(bytemuck::cast_slice(segment)).map_err(|e| io_error(right_rank, timeout, e))?;
                self.bytes_sent += std::mem::size_of_val(segment) as u64;
            }
        }
        Ok(())
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }
}
