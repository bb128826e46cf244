//! What the collective tests share: rendezvous addresses, configurations and inputs.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ringtrain_worker::RendezvousConfig;

/// A free rendezvous address below the kernel's ephemeral range (32768 and up by default). A port bound to
/// :0 and released could be handed to another test process's ring listener (bound to :0) before rank 0
/// binds it; that once left the ranks waiting out their join timeout. Ports here are never handed out for
/// :0, and each process walks its own sequence of them.
pub fn free_address() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (std::process::id().wrapping_mul(97).wrapping_add(n) % 12_000) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().unwrap();
        }
    }
}

pub fn config(address: SocketAddr, rank: usize, world: usize, io_timeout: Duration) -> RendezvousConfig {
    RendezvousConfig { address, rank, world, join_timeout: Duration::from_secs(20), io_timeout, secret: None }
}

/// Rank r's input: element i is r * 1000 + i (mod a small prime, so sums stay exact in f32).
pub fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank * 1000 + i) % 251) as f32).collect()
}
