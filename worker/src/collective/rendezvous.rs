//! Rendezvous: rank 0 listens on a known address, the other ranks connect and say which rank they are and
//! where their ring listener is; rank 0 answers everyone with the full address table. Each rank then
//! connects to its right neighbour and accepts its left one. Messages are JSON lines.
//!
//! With a placement secret (the server makes one per placement; `train --local` its own), every connection
//! is authenticated: the listening side sends a fresh nonce, the connecting rank answers with
//! HMAC-SHA256(secret, nonce and its hello), and rank 0 signs the address table for the nonce each rank
//! sent. A stranger, a port scanner or a wrong proof is dropped and the listener keeps waiting: it cannot
//! join the ring (reading or injecting gradients), nor fail the placement.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
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
    /// The placement's secret, which every rank proves on every connection (None: no authentication, for
    /// ranks of one test process).
    pub secret: Option<String>,
}

/// The listening side's first line, when there is a secret: a fresh nonce to prove the secret against.
#[derive(Debug, Serialize, Deserialize)]
struct Challenge {
    nonce: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    rank: usize,
    world: usize,
    ring_port: u16,
    /// Which of the rings the rendezvous makes this connection joins (see [`connect_rings`]); 0 for the
    /// hello to rank 0.
    #[serde(default)]
    ring: usize,
    /// The connecting rank's own nonce, which rank 0 signs the address table for.
    #[serde(default)]
    nonce: String,
    /// HMAC(secret, challenge nonce, rank, world, ring port, own nonce), hex.
    #[serde(default)]
    proof: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Table {
    peers: Vec<SocketAddr>,
    /// HMAC(secret, the rank's nonce, the peers), hex.
    #[serde(default)]
    proof: String,
}

/// HMAC-SHA256 of `parts` (joined by newlines) under `secret`, hex.
fn sign(secret: &str, parts: &[&str]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(parts.join("\n").as_bytes());
    ringtrain_core::hex(&mac.finalize().into_bytes())
}

/// Constant-time comparison of two proofs.
fn same_proof(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn fresh_nonce() -> String {
    format!("{}", uuid::Uuid::new_v4().simple())
}

impl Hello {
    fn signed(mut self, secret: &Option<String>, challenge: &str) -> Hello {
        if let Some(secret) = secret {
            self.proof = sign(secret, &self.signed_parts(challenge).iter().map(String::as_str).collect::<Vec<_>>());
        }
        self
    }

    fn signed_parts(&self, challenge: &str) -> Vec<String> {
        vec![
            "hello".into(),
            challenge.into(),
            self.rank.to_string(),
            self.world.to_string(),
            self.ring_port.to_string(),
            self.ring.to_string(),
            self.nonce.clone(),
        ]
    }

    fn verify(&self, secret: &Option<String>, challenge: &str) -> bool {
        match secret {
            None => true,
            Some(secret) => {
                let parts = self.signed_parts(challenge);
                same_proof(&self.proof, &sign(secret, &parts.iter().map(String::as_str).collect::<Vec<_>>()))
            }
        }
    }
}

fn table_proof(secret: &str, nonce: &str, peers: &[SocketAddr]) -> String {
    let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
    sign(secret, &[&["table", nonce], &peers.iter().map(String::as_str).collect::<Vec<_>>()[..]].concat())
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
    let everyone: Vec<usize> = (0..config.world).collect();
    let mut links = connect_rings(config, &[everyone])?;
    links.pop().flatten().ok_or_else(|| rv_err("a ring needs at least two ranks"))
}

/// Runs the rendezvous once and joins several rings over it: each ring a list of the world's ranks in ring
/// order (a pipelined job's ranks form one ring per stage across its workers, and one chain per worker
/// across its stages). Returns this rank's links in each ring, None where it is not a member or the ring
/// has fewer than two. Every connection proves the placement's secret, and says which ring it joins.
pub fn connect_rings(config: &RendezvousConfig, rings: &[Vec<usize>]) -> CommResult<Vec<Option<RingLinks>>> {
    let bind_ip = own_address(config);
    let ring_listener = TcpListener::bind((bind_ip, 0)).map_err(|e| rv_err(format!("cannot open a ring port: {e}")))?;
    let ring_port = ring_listener.local_addr().map_err(|e| rv_err(e.to_string()))?.port();
    let hello = |ring| Hello {
        rank: config.rank,
        world: config.world,
        ring_port,
        ring,
        nonce: fresh_nonce(),
        proof: String::new(),
    };

    let peers = if config.rank == 0 { serve_table(config, ring_port)? } else { fetch_table(config, hello(0))? };

    // (ring, left neighbour, right neighbour) of every ring this rank is in
    let mine: Vec<(usize, usize, usize)> = rings
        .iter()
        .enumerate()
        .filter_map(|(ring, members)| {
            let at = members.iter().position(|&r| r == config.rank)?;
            let len = members.len();
            (len > 1).then(|| (ring, members[(at + len - 1) % len], members[(at + 1) % len]))
        })
        .collect();
    if let Some(stranger) = rings.iter().flatten().find(|&&r| r >= config.world) {
        return Err(rv_err(format!("a ring names rank {stranger} of a world of {}", config.world)));
    }
    // Accepting the left neighbours runs beside connecting to the right ones: with a secret each listener
    // must answer with a challenge, so a rank that finished its right side before accepting its left would
    // wait in a circle with all the others.
    let deadline = Instant::now() + config.join_timeout;
    let (lefts, rights) = std::thread::scope(|scope| {
        let lefts = scope.spawn(|| accept_lefts(&ring_listener, config, deadline, &mine));
        let rights: CommResult<Vec<TcpStream>> =
            mine.iter().map(|&(ring, _, right)| connect_right(config, peers[right], right, hello(ring))).collect();
        let lefts = lefts.join().unwrap_or_else(|_| Err(rv_err("the accepting thread panicked")));
        (lefts, rights)
    });
    let (mut lefts, rights) = (lefts?, rights?);
    let mut links: Vec<Option<RingLinks>> = rings.iter().map(|_| None).collect();
    for (&(ring, _, _), right) in mine.iter().zip(rights) {
        let left = lefts.remove(&ring).ok_or_else(|| rv_err("a left neighbour went missing"))?;
        for stream in [&left, &right] {
            tune(stream, config.io_timeout).map_err(|e| rv_err(format!("socket options: {e}")))?;
        }
        links[ring] = Some(RingLinks { left, right });
    }
    Ok(links)
}

/// Accepts the left neighbour of every ring in `mine`, in whatever order they come.
fn accept_lefts(
    listener: &TcpListener,
    config: &RendezvousConfig,
    deadline: Instant,
    mine: &[(usize, usize, usize)],
) -> CommResult<std::collections::HashMap<usize, TcpStream>> {
    let mut lefts = std::collections::HashMap::new();
    while lefts.len() < mine.len() {
        let awaited: Vec<(usize, usize)> =
            mine.iter().filter(|(ring, ..)| !lefts.contains_key(ring)).map(|&(ring, left, _)| (ring, left)).collect();
        let (hello, stream) =
            accept_proven(listener, config, deadline, |greeting| awaited.contains(&(greeting.ring, greeting.rank)))
                .map_err(|e| {
                    let missing: Vec<String> = awaited.iter().map(|(_, left)| format!("rank {left}")).collect();
                    rv_err(format!("{} never joined this rank's ring port: {e}", missing.join(", ")))
                })?;
        lefts.insert(hello.ring, stream);
    }
    Ok(lefts)
}

/// The address this rank's ring port listens on: its own address on the network it shares with rank 0
/// (rank 0's is the rendezvous address itself), never every interface of the host.
fn own_address(config: &RendezvousConfig) -> IpAddr {
    let rank0 = config.address.ip();
    if rank0.is_loopback() {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    if config.rank == 0 {
        return rank0;
    }
    // the local address of the route to rank 0 (a UDP "connect" sends nothing)
    std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|socket| socket.connect(config.address).and_then(|()| socket.local_addr()))
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip())
}

/// Connects to the right neighbour's ring port and proves this rank's place.
fn connect_right(
    config: &RendezvousConfig,
    address: SocketAddr,
    right_rank: usize,
    hello: Hello,
) -> CommResult<TcpStream> {
    let right = connect_retrying(address, config.join_timeout)
        .map_err(|e| rv_err(format!("cannot reach rank {right_rank} at {address}: {e}")))?;
    let (challenge, right) = receive_challenge(right, config)
        .map_err(|e| rv_err(format!("rank {right_rank} did not greet this rank: {e}")))?;
    write_line(&right, &hello.signed(&config.secret, &challenge))
        .map_err(|e| rv_err(format!("rank {right_rank}: {e}")))?;
    Ok(right)
}

/// The socket rank 0's process was handed to accept the rendezvous on ([`listen_on`]).
static HANDED: Mutex<Option<TcpListener>> = Mutex::new(None);

/// Rank 0 accepts the rendezvous on `listener` (bound by whoever started it, to the port it told the other
/// ranks) instead of binding that port itself: between an agent finding a free port and the rank binding
/// it, another process could take it, and the placement failed (seen under a test suite's load).
pub fn listen_on(listener: TcpListener) {
    if let Ok(mut handed) = HANDED.lock() {
        *handed = Some(listener);
    }
}

/// The handed socket if it is bound to `address`, else `address` bound now.
fn rank0_listener(address: SocketAddr) -> CommResult<TcpListener> {
    let handed = HANDED.lock().ok().and_then(|h| h.as_ref().and_then(|l| l.try_clone().ok()));
    match handed {
        Some(listener) if listener.local_addr().ok() == Some(address) => Ok(listener),
        _ => TcpListener::bind(address).map_err(|e| rv_err(format!("rank 0 cannot listen on {address}: {e}"))),
    }
}

/// Rank 0: accepts every other rank's hello and sends back the address table.
fn serve_table(config: &RendezvousConfig, ring_port: u16) -> CommResult<Vec<SocketAddr>> {
    let listener = rank0_listener(config.address)?;
    let deadline = Instant::now() + config.join_timeout;
    let mut peers: Vec<Option<SocketAddr>> = vec![None; config.world];
    peers[0] = Some(SocketAddr::new(config.address.ip(), ring_port));
    let mut joined: Vec<(String, TcpStream)> = Vec::new();
    while peers.iter().any(Option::is_none) {
        let wanted = |hello: &Hello| hello.rank != 0 && peers.get(hello.rank).is_some_and(Option::is_none);
        let (hello, stream) = accept_proven(&listener, config, deadline, wanted).map_err(|_| {
            // Each missing rank named as "rank N", the way every other failure names a rank.
            let missing: Vec<String> =
                (0..config.world).filter(|&r| peers[r].is_none()).map(|r| format!("rank {r}")).collect();
            rv_err(format!("{} did not join within {:?}", missing.join(", "), config.join_timeout))
        })?;
        let peer_ip = stream.peer_addr().map_err(|e| rv_err(e.to_string()))?.ip();
        peers[hello.rank] = Some(SocketAddr::new(peer_ip, hello.ring_port));
        joined.push((hello.nonce, stream));
    }
    let peers: Vec<SocketAddr> = peers.into_iter().flatten().collect();
    for (nonce, stream) in &joined {
        let proof = config.secret.as_deref().map_or_else(String::new, |s| table_proof(s, nonce, &peers));
        let table = Table { peers: peers.clone(), proof };
        write_line(stream, &table).map_err(|e| rv_err(format!("cannot send the address table: {e}")))?;
    }
    Ok(peers)
}

/// Ranks 1..k: says hello to rank 0 (retrying until it listens) and reads the address table.
fn fetch_table(config: &RendezvousConfig, hello: Hello) -> CommResult<Vec<SocketAddr>> {
    let stream = connect_retrying(config.address, config.join_timeout)
        .map_err(|e| rv_err(format!("cannot reach rank 0 at {}: {e}", config.address)))?;
    let (challenge, stream) =
        receive_challenge(stream, config).map_err(|e| rv_err(format!("rank 0 did not greet this rank: {e}")))?;
    let hello = hello.signed(&config.secret, &challenge);
    write_line(&stream, &hello).map_err(|e| rv_err(format!("rank 0: {e}")))?;
    let (table, _) = read_line::<Table>(stream, config.join_timeout)
        .map_err(|e| rv_err(format!("no address table from rank 0 (a wrong rendezvous secret?): {e}")))?;
    if let Some(secret) = &config.secret {
        if !same_proof(&table.proof, &table_proof(secret, &hello.nonce, &table.peers)) {
            return Err(rv_err("the address table is not signed with this placement's secret"));
        }
    }
    if table.peers.len() != config.world {
        return Err(rv_err(format!("address table lists {} ranks, expected {}", table.peers.len(), config.world)));
    }
    Ok(table.peers)
}

/// The connecting side: the listener's challenge (none without a secret).
fn receive_challenge(stream: TcpStream, config: &RendezvousConfig) -> std::io::Result<(String, TcpStream)> {
    if config.secret.is_none() {
        return Ok((String::new(), stream));
    }
    let (challenge, stream) = read_line::<Challenge>(stream, config.join_timeout)?;
    Ok((challenge.nonce, stream))
}

/// The listening side: accepts connections until one proves the secret and says a hello `wanted` accepts
/// (the expected rank, the right world). Anything else (a stranger, garbage, a wrong proof, a rank that
/// already joined) is dropped with a note on stderr, and the wait goes on until `deadline`.
fn accept_proven(
    listener: &TcpListener,
    config: &RendezvousConfig,
    deadline: Instant,
    wanted: impl Fn(&Hello) -> bool,
) -> std::io::Result<(Hello, TcpStream)> {
    loop {
        let stream = accept_before(listener, deadline)?;
        let from = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        let challenge = if config.secret.is_some() { fresh_nonce() } else { String::new() };
        if config.secret.is_some() && write_line(&stream, &Challenge { nonce: challenge.clone() }).is_err() {
            continue;
        }
        // a short read timeout for strangers: a silent connection must not hold the rendezvous up
        let patience = deadline.saturating_duration_since(Instant::now()).min(Duration::from_secs(10));
        match read_line::<Hello>(stream, patience.max(Duration::from_millis(100))) {
            Ok((hello, stream))
                if hello.world == config.world && hello.verify(&config.secret, &challenge) && wanted(&hello) =>
            {
                return Ok((hello, stream));
            }
            Ok((hello, _)) => eprintln!(
                "rank {}: dropped a connection from {from} claiming rank {} of {} (wrong proof, world or rank)",
                config.rank, hello.rank, hello.world
            ),
            Err(e) => eprintln!("rank {}: dropped a connection from {from}: {e}", config.rank),
        }
    }
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
