//! What a GPU rank's NCCL is told so that it needs no Unix socket to another process. NCCL passes file
//! descriptors between the ranks of one host over abstract datagram sockets whenever it shares GPU or
//! host memory through cuMem handles (its default on recent drivers: P2P buffers, NVLS multicast, cuMem
//! host memory); otherwise it shares GPU memory by CUDA IPC handles, which travel over its TCP bootstrap.
//! Turning cuMem (and NVLS, which needs it) off lets the sandbox scope every rank's abstract sockets to
//! the rank itself, so no rank reaches another's, of its own job or another team's. The cost: no NVLink
//! SHARP (NVLS) all-reduce on NVSwitch hosts and no multi-node NVLink, which need cuMem.
//!
//! Set in [`crate::enter`] (the process is single-threaded there, and NCCL reads its environment later,
//! when the first communicator is made), whatever the caller's environment said: a rank started by hand
//! gets the same rule as one an agent starts.

/// The variables and the values the sandbox gives them.
pub const SETTINGS: &[(&str, &str)] = &[("NCCL_CUMEM_ENABLE", "0"), ("NCCL_NVLS_ENABLE", "0")];

/// Sets [`SETTINGS`] in this process's environment. Call only while the process has one thread.
pub(crate) fn without_unix_sockets_between_ranks() {
    for (name, value) in SETTINGS {
        std::env::set_var(name, value);
    }
}
