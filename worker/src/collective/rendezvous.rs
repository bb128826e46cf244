//! Rendezvous: rank 0 listens on a known address, the other ranks connect and say which rank they are and
//! where their ring listener is; rank 0 answers everyone with the full address table. Each rank then
//! connects to its right neighbour and accepts its left one. Messages are JSON lines.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{CommError, CommResult};

#[derive(Debug, Clone)]
pub struct RendezvousConfig {
    /// Where rank 0 listens and the others connect.
    pub address: SocketAddr,
    pub rank: usize,
    pub world: usize,
    /// How long rank 0 waits for everyone, and the others keep retrying to reach rank 0.
    pub join_timeout: Duration,
    /// How long any send or receive may block once training runs; past it the peer counts as stalled.
    pub io_timeout: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    rank: usize,
    world: usize,
    ring_port: u16,
}

#[derive(Debug, Serialize, Deserialize)]
struct Table {
    peers: Vec<SocketAddr>,
}

/// The two ring connections of a rank: it receives from `left` (rank - 1) and sends to `right` (rank + 1).
#[derive(Debug)]
pub struct RingLinks {
    pub left: TcpStream,
    pub right: TcpStream,
}

fn rv_err(message: impl Into<String>) -> CommError {
    CommError::Rendezvous(message.into())
}

/// Runs the rendezvous for a world of at least two ranks and returns this rank's ring links.
pub fn connect_ring(config: &RendezvousConfig) -> CommResult<RingLinks> {
    let bind_ip = if config.address.ip().is_loopback() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let ring_listener = TcpListener::bind((bind_ip, 0)).map_err(|e| rv_err(format!("cannot open a ring port: {e}")))?;
    let ring_port = ring_listener.local_addr().map_err(|e| rv_err(e.to_string()))?.port();
    let hello = Hello { rank: config.rank, world: config.world, ring_port };

    let peers = if config.rank == 0 { serve_table(config, ring_port)? } else { fetch_table(config, &hello)? };

    let right_rank = (config.rank + 1) % config.world;
    let left_rank = (config.rank + config.world - 1) % config.world;
    let right = connect_retrying(peers[right_rank], config.join_timeout)
        .map_err(|e| rv_err(format!("cannot reach rank {right_rank} at {}: {e}", peers[right_rank])))?;
    write_line(&right, &hello).map_err(|e| rv_err(format!("rank {right_rank}: {e}")))?;
    let left = accept_before(&ring_listener, Instant::now() + config.join_timeout)
        .map_err(|e| rv_err(format!("rank {left_rank} never connected to this rank's ring port: {e}")))?;
    let (greeting, left) = read_line::<Hello>(left, config.join_timeout)
        .map_err(|e| rv_err(format!("bad greeting from rank {left_rank}: {e}")))?;
    if greeting.rank != left_rank {
        return Err(rv_err(format!("expected rank {left_rank} on the ring, got rank {}", greeting.rank)));
    }
    for stream in [&left, &right] {
        tune(stream, config.io_timeout).map_err(|e| rv_err(format!("socket options: {e}")))?;
    }
    Ok(RingLinks { left, right })
}

/// Rank 0: accepts every other rank's hello and sends back the address table.
fn serve_table(config: &RendezvousConfig, ring_port: u16) -> CommResult<Vec<SocketAddr>> {
    let listener = TcpListener::bind(config.address)
        .map_err(|e| rv_err(format!("rank 0 cannot listen on {}: {e}", config.address)))?;
    let deadline = Instant::now() + config.join_timeout;
    let mut peers: Vec<Option<SocketAddr>> = vec![None; config.world];
    peers[0] = Some(SocketAddr::new(config.address.ip(), ring_port));
    let mut joined: Vec<TcpStream> = Vec::new();
    while peers.iter().any(Option::is_none) {
        let stream = accept_before(&listener, deadline).map_err(|_| {
            // Each missing rank named as "rank N", the way every other failure names a rank.
            let missing: Vec<String> =
                (0..config.world).filter(|&r| peers[r].is_none()).map(|r| format!("rank {r}")).collect();
            rv_err(format!("{} did not join within {:?}", missing.join(", "), config.join_timeout))
        })?;
        let peer_ip = stream.peer_addr().map_err(|e| rv_err(e.to_string()))?.ip();
        let (hello, stream) = read_line::<Hello>(stream, config.join_timeout).map_err(|e| rv_err(e.to_string()))?;
        if hello.world != config.world {
            return Err(rv_err(format!(
                "rank {} thinks the world has {} ranks, not {}",
                hello.rank, hello.world, config.world
            )));
        }
        match peers.get_mut(hello.rank) {
            Some(slot @ None) if hello.rank != 0 => *slot = Some(SocketAddr::new(peer_ip, hello.ring_port)),
            _ => return Err(rv_err(format!("rank {} joined twice or is out of range", hello.rank))),
        }
        joined.push(stream);
    }
    let peers: Vec<SocketAddr> = peers.into_iter().flatten().collect();
    let table = Table { peers: peers.clone() };
    for stream in &joined {
        write_line(stream, &table).map_err(|e| rv_err(format!("cannot send the address table: {e}")))?;
    }
    Ok(peers)
}

/// Ranks 1..k: says hello to rank 0 (retrying until it listens) and reads the address table.
fn fetch_table(config: &RendezvousConfig, hello: &Hello) -> CommResult<Vec<SocketAddr>> {
    let stream = connect_retrying(config.address, config.join_timeout)
        .map_err(|e| rv_err(format!("cannot reach rank 0 at {}: {e}", config.address)))?;
    write_line(&stream, hello).map_err(|e| rv_err(format!("rank 0: {e}")))?;
    let (table, _) = read_line::<Table>(stream, config.join_timeout)
        .map_err(|e| rv_err(format!("no address table from rank 0: {e}")))?;
    if table.peers.len() != config.world {
        return Err(rv_err(format!("address table lists {} ranks, expected {}", table.peers.len(), config.world)));
    }
    Ok(table.peers)
}

fn connect_retrying(address: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn accept_before(listener: &TcpListener, deadline: Instant) -> std::io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

fn write_line<T: Serialize>(mut stream: &TcpStream, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one JSON line byte by byte: a buffered reader could swallow the first bytes of the training
/// traffic that follows the greeting on the same connection.
fn read_line<T: for<'de> Deserialize<'de>>(
    mut stream: TcpStream,
    timeout: Duration,
) -> std::io::Result<(T, TcpStream)> {
    const MAX_LINE: usize = 1 << 20;
    stream.set_read_timeout(Some(timeout))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_LINE {
        stream.read_exact(&mut byte)?;
        if byte[0] == b'\n' {
            let value =
                serde_json::from_slice(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            return Ok((value, stream));
        }
        line.push(byte[0]);
    }
    Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"))
}

/// Low latency, big buffers, and the stall timeout on both directions.
fn tune(stream: &TcpStream, io_timeout: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(stream);
    socket.set_send_buffer_size(4 << 20)?;
    socket.set_recv_buffer_size(4 << 20)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    Ok(())
}
