//! The links between the stages of one worker's pipeline: stage s sends its activations to stage s+1 and
//! receives their gradients back from it, over one TCP connection per neighbouring pair.
//!
//! The connections are made by the rendezvous the ring all-reduce uses (authenticated with the placement's
//! secret), with the stages as its ranks: rank s's link to its right neighbour is the connection to stage
//! s+1, and its link from the left the one from stage s−1; the ring's wrap-around connection is unused.
//!
//! Each link's incoming direction is drained by a thread of its own into a queue. Without it, GPipe's
//! fill-drain deadlocks as soon as the tensors outgrow the sockets' buffers: stage s still sending
//! micro-batch j+1's activations while stage s+1, blocked on sending micro-batch j's gradients back, reads
//! nothing. With it a receive also overlaps the computation it waits behind.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use crate::collective::{connect_ring, CommError, CommResult, RendezvousConfig, RingLinks};

/// The first four bytes of every message, so a link that lost its framing says so instead of reading noise.
const MAGIC: u32 = u32::from_le_bytes(*b"RTPL");
/// A message holds at most this many tensors, each of at most this many dimensions and elements: anything
/// more is a broken peer.
const MAX_TENSORS: usize = 1 << 16;
const MAX_DIMS: usize = 8;
const MAX_ELEMS: usize = 1 << 30;

/// A tensor's name is at most this long (a variable's path; empty for activations and gradients).
const MAX_NAME: usize = 1024;

/// A tensor as it arrived: its name, shape and values (f32, row-major).
#[derive(Debug)]
struct Arrived {
    name: String,
    shape: Vec<i64>,
    values: Vec<f32>,
}

type Received = CommResult<Vec<Arrived>>;

/// One direction-pair with a neighbouring stage.
#[derive(Debug)]
struct Link {
    /// The neighbour's rank in the job, for errors (whose details name its stage).
    peer: usize,
    stage: usize,
    writer: TcpStream,
    incoming: Receiver<Received>,
    reader: Option<JoinHandle<()>>,
}

impl Link {
    fn new(peer: usize, stage: usize, stream: TcpStream) -> CommResult<Link> {
        let reading = stream.try_clone().map_err(|source| CommError::Io { peer, source })?;
        // the reader waits as long as the stages are busy (an evaluation, a checkpoint); a stalled peer is
        // found by the receiving side's timeout instead
        reading.set_read_timeout(None).map_err(|source| CommError::Io { peer, source })?;
        let (queue, incoming) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name(format!("stage-link-{stage}"))
            .spawn(move || read_messages(peer, stage, reading, &queue))
            .map_err(|source| CommError::Io { peer, source })?;
        Ok(Link { peer, stage, writer: stream, incoming, reader: Some(reader) })
    }

    /// Sends `tensors` as one message: their count, then each one's name, shape and values.
    fn send(&mut self, tensors: &[(&str, &Tensor)]) -> CommResult<u64> {
        let (peer, stage) = (self.peer, self.stage);
        let timeout = self.writer.write_timeout().ok().flatten().unwrap_or_default();
        let closed = |e: std::io::Error| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::PeerTimedOut { peer, timeout },
            _ => CommError::PeerClosed { peer, detail: format!("its link as pipeline stage {stage}: {e}") },
        };
        let mut message = Vec::new();
        message.extend_from_slice(&MAGIC.to_le_bytes());
        message.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
        for (name, tensor) in tensors {
            if name.len() > MAX_NAME {
                return Err(CommError::Unsupported(format!("a tensor name of {} bytes crosses no link", name.len())));
            }
            message.extend_from_slice(&(name.len() as u32).to_le_bytes());
            message.extend_from_slice(name.as_bytes());
            let values = tensor.detach().to_device(tch::Device::Cpu).to_kind(Kind::Float).contiguous();
            let shape = values.size();
            message.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in &shape {
                message.extend_from_slice(&d.to_le_bytes());
            }
            let start = message.len();
            message.resize(start + values.numel() * 4, 0);
            values
                .f_copy_data_u8(&mut message[start..], values.numel())
                .map_err(|e| CommError::Io { peer, source: std::io::Error::other(e) })?;
        }
        self.writer.write_all(&message).map_err(closed)?;
        Ok(message.len() as u64)
    }

    fn receive(&mut self, timeout: Duration) -> CommResult<Vec<(String, Tensor)>> {
        let tensors = match self.incoming.recv_timeout(timeout) {
            Ok(message) => message?,
            Err(RecvTimeoutError::Timeout) => return Err(CommError::PeerTimedOut { peer: self.peer, timeout }),
            Err(RecvTimeoutError::Disconnected) => {
                let detail = format!("its link as pipeline stage {} ended", self.stage);
                return Err(CommError::PeerClosed { peer: self.peer, detail });
            }
        };
        Ok(tensors.into_iter().map(|t| (t.name, Tensor::from_slice(&t.values).view(t.shape.as_slice()))).collect())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // ends the reader's blocking read
        let _ = self.writer.shutdown(Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The reader thread: one message after another into `queue`, until the connection ends or breaks (the
/// error goes into the queue: the next receive reports it).
fn read_messages(peer: usize, stage: usize, mut stream: TcpStream, queue: &mpsc::Sender<Received>) {
    loop {
        let message = read_message(peer, stage, &mut stream);
        let failed = message.is_err();
        if queue.send(message).is_err() || failed {
            return;
        }
    }
}

fn read_message(peer: usize, stage: usize, stream: &mut TcpStream) -> Received {
    let broken = |detail: String| CommError::PeerClosed {
        peer,
        detail: format!("its link as pipeline stage {stage}: {detail}"),
    };
    let mut word = [0u8; 4];
    let mut read_word = |stream: &mut TcpStream| -> CommResult<usize> {
        stream.read_exact(&mut word).map_err(|e| broken(e.to_string()))?;
        Ok(u32::from_le_bytes(word) as usize)
    };
    if read_word(stream)? != MAGIC as usize {
        return Err(broken("sent something that is not a tensor message".into()));
    }
    let count = read_word(stream)?;
    if count > MAX_TENSORS {
        return Err(broken(format!("sent a message of {count} tensors")));
    }
    let mut tensors = Vec::with_capacity(count);
    for _ in 0..count {
        let name_len = read_word(stream)?;
        if name_len > MAX_NAME {
            return Err(broken(format!("sent a tensor name of {name_len} bytes")));
        }
        let mut name = vec![0u8; name_len];
        stream.read_exact(&mut name).map_err(|e| broken(e.to_string()))?;
        let name = String::from_utf8(name).map_err(|_| broken("sent a tensor name that is not UTF-8".into()))?;
        let dims = read_word(stream)?;
        if dims > MAX_DIMS {
            return Err(broken(format!("sent a tensor of {dims} dimensions")));
        }
        let mut shape = Vec::with_capacity(dims);
        for _ in 0..dims {
            let mut dim = [0u8; 8];
            stream.read_exact(&mut dim).map_err(|e| broken(e.to_string()))?;
            shape.push(i64::from_le_bytes(dim));
        }
        let elems = shape.iter().try_fold(1usize, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)));
        let Some(elems) = elems.filter(|&n| n <= MAX_ELEMS) else {
            return Err(broken(format!("sent a tensor of shape {shape:?}")));
        };
        let mut values = vec![0f32; elems];
        stream.read_exact(bytemuck::cast_slice_mut(&mut values)).map_err(|e| broken(e.to_string()))?;
        tensors.push(Arrived { name, shape, values });
    }
    Ok(tensors)
}

/// Stage s's links to stage s−1 (`previous`) and s+1 (`next`), where they exist.
#[derive(Debug)]
pub struct StageLinks {
    stage: usize,
    stages: usize,
    previous: Option<Link>,
    next: Option<Link>,
    io_timeout: Duration,
    /// What this stage spent sending and waiting to receive, and the bytes it sent.
    pub traffic: Traffic,
}

/// A stage's communication with its neighbours, summed since it was last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub sending: Duration,
    /// Blocked on a receive: the neighbour had not finished its part yet (the pipeline's bubble, seen from
    /// this stage) or the tensor was still on the wire.
    pub waiting: Duration,
    pub bytes_sent: u64,
}

impl StageLinks {
    /// Connects stage `config.rank` of `config.world` stages (one worker's) to its neighbours.
    pub fn connect(config: &RendezvousConfig) -> CommResult<StageLinks> {
        let links = if config.world > 1 { Some(connect_ring(config)?) } else { None };
        StageLinks::over(config.rank, config.world, 0, links, config.io_timeout)
    }

    /// Stage `stage` of `stages` over the ring links a rendezvous made among one worker's stages (None: a
    /// pipeline of one stage); the worker's first stage is rank `first_rank` of the job.
    pub fn over(
        stage: usize,
        stages: usize,
        first_rank: usize,
        links: Option<RingLinks>,
        io_timeout: Duration,
    ) -> CommResult<StageLinks> {
        let (mut previous, mut next) = (None, None);
        if let Some(links) = links {
            if stage > 0 {
                previous = Some(Link::new(first_rank + stage - 1, stage - 1, links.left)?);
            }
            if stage + 1 < stages {
                next = Some(Link::new(first_rank + stage + 1, stage + 1, links.right)?);
            }
        }
        Ok(StageLinks { stage, stages, previous, next, io_timeout, traffic: Traffic::default() })
    }

    pub fn stage(&self) -> usize {
        self.stage
    }

    pub fn stages(&self) -> usize {
        self.stages
    }

    pub fn is_first(&self) -> bool {
        self.stage == 0
    }

    pub fn is_last(&self) -> bool {
        self.stage + 1 == self.stages
    }

    /// Sends this stage's outputs (activations: one tensor, or one per sub-module a later stage reads) to
    /// the next stage.
    pub fn send_forward(&mut self, activations: &[Tensor]) -> CommResult<()> {
        let link = self.next.as_mut().ok_or_else(|| unlinked(self.stage, "no next stage"))?;
        Self::timed_send(link, &unnamed(activations), &mut self.traffic)
    }

    /// Sends the gradients of this stage's inputs back to the previous stage, in their order.
    pub fn send_backward(&mut self, gradients: &[Tensor]) -> CommResult<()> {
        let link = self.previous.as_mut().ok_or_else(|| unlinked(self.stage, "no previous stage"))?;
        Self::timed_send(link, &unnamed(gradients), &mut self.traffic)
    }

    /// Sends named tensors (a stage's weights and state, between steps) back to the previous stage.
    pub fn send_named_backward(&mut self, tensors: &[(String, Tensor)]) -> CommResult<()> {
        let link = self.previous.as_mut().ok_or_else(|| unlinked(self.stage, "no previous stage"))?;
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Self::timed_send(link, &named, &mut self.traffic)
    }

    /// Sends named tensors on to the next stage.
    pub fn send_named_forward(&mut self, tensors: &[(String, Tensor)]) -> CommResult<()> {
        let link = self.next.as_mut().ok_or_else(|| unlinked(self.stage, "no next stage"))?;
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Self::timed_send(link, &named, &mut self.traffic)
    }

    /// The previous stage's next activations: this stage's inputs.
    pub fn receive_forward(&mut self) -> CommResult<Vec<Tensor>> {
        Ok(self.receive_named_forward()?.into_iter().map(|(_, t)| t).collect())
    }

    /// The next stage's gradients of this stage's next outputs.
    pub fn receive_backward(&mut self) -> CommResult<Vec<Tensor>> {
        Ok(self.receive_named_backward()?.into_iter().map(|(_, t)| t).collect())
    }

    /// The previous stage's next message, with the tensors' names.
    pub fn receive_named_forward(&mut self) -> CommResult<Vec<(String, Tensor)>> {
        let link = self.previous.as_mut().ok_or_else(|| unlinked(self.stage, "no previous stage"))?;
        Self::timed_receive(link, self.io_timeout, &mut self.traffic)
    }

    /// The next stage's next message, with the tensors' names.
    pub fn receive_named_backward(&mut self) -> CommResult<Vec<(String, Tensor)>> {
        let link = self.next.as_mut().ok_or_else(|| unlinked(self.stage, "no next stage"))?;
        Self::timed_receive(link, self.io_timeout, &mut self.traffic)
    }

    fn timed_send(link: &mut Link, tensors: &[(&str, &Tensor)], traffic: &mut Traffic) -> CommResult<()> {
        let started = Instant::now();
        traffic.bytes_sent += link.send(tensors)?;
        traffic.sending += started.elapsed();
        Ok(())
    }

    fn timed_receive(link: &mut Link, timeout: Duration, traffic: &mut Traffic) -> CommResult<Vec<(String, Tensor)>> {
        let started = Instant::now();
        let tensor = link.receive(timeout);
        traffic.waiting += started.elapsed();
        tensor
    }
}

fn unnamed(tensors: &[Tensor]) -> Vec<(&str, &Tensor)> {
    tensors.iter().map(|t| ("", t)).collect()
}

fn unlinked(stage: usize, what: &str) -> CommError {
    CommError::Unsupported(format!("pipeline stage {stage} has {what} to talk to"))
}
