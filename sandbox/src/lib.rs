//! Confines tenant code. An uploaded TorchScript model is a program (libtorch runs its `__setstate__` at
//! load and registers operators that map and write any file), and a dataset or a spec is input written by
//! someone who may be attacking the platform. Every process that touches them — the server's model check
//! (`ringtrain models check`), every rank an agent starts, `ringtrain train` given an uploaded model —
//! confines itself with [`enter`] before it opens any of them:
//!
//! - **files** ([`filesystem`], Landlock): it reads only its own inputs, the loader's and libtorch's files,
//!   `/proc/self` and a few device files; it writes only its private folder; it executes nothing;
//! - **network** (Landlock TCP rules): a rank binds and connects only the ephemeral ports its all-reduce
//!   ring uses and its rendezvous port (not Postgres, not the API); a model check has no network at all;
//! - **Unix sockets** ([`syscalls`], Landlock scopes): a CPU rank or a check opens none, so no service
//!   listening on a socket file (the node's Postgres, D-Bus, a container engine) is reachable; a GPU rank
//!   opens only the datagram kind NCCL's proxy binds, reaches no other process's abstract socket, and its
//!   NCCL is told to need none ([`nccl`]);
//! - **system calls** ([`syscalls`], seccomp): what training never needs is refused (ptrace, mount, bpf,
//!   perf events, keys, namespaces, kernel modules, exec, fork);
//! - **resources** ([`limits`]): file size, open files, processes, CPU time, no core dumps;
//! - **the process itself**: no new privileges, not dumpable (no ptrace or `/proc` peeking by the same
//!   user), no file descriptor inherited beyond stdio and those passed on purpose.
//!
//! The parent's half is in [`launch`]: an allow-listed environment, the inputs passed as open files
//! (`/proc/self/fd/N`, so the child needs no permission on the parent's folders), an unprivileged user
//! ([`user`]) and a cgroup ([`cgroup`]). [`support`] says what this kernel offers; where Landlock or
//! seccomp is missing, [`enter`] fails unless the operator allowed unsandboxed tenant code.

pub mod cgroup;
pub mod environment;
pub mod filesystem;
pub mod launch;
pub mod limits;
pub mod nccl;
pub mod support;
pub mod syscalls;
pub mod user;

use std::path::PathBuf;

pub use environment::allowed_environment;
pub use launch::{passed_path, shared_memory_file, take_passed, Launch};
pub use limits::Limits;
pub use support::{probe, Support};
pub use user::RankUser;

/// What a confined process may touch.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Confinement {
    /// Files and folders (all beneath) it may read: its own inputs. A path may be `/proc/self/fd/N`, a file
    /// its parent passed it open.
    pub read: Vec<PathBuf>,
    /// Folders it may read and write: its private working folder, and where it writes its results.
    pub write: Vec<PathBuf>,
    /// Descriptors its parent passed it (`/proc/self/fd/N`) that it keeps and uses as they are, never
    /// opening a path: the shared memory segment the ranks of one machine all-reduce through. No file rule
    /// names them (Landlock takes no rule on a `memfd`); they stay open where other inherited ones close.
    #[serde(default)]
    pub kept: Vec<PathBuf>,
    /// A GPU rank: the NVIDIA device files and what CUDA and NCCL read (`/sys`, `/proc/driver/nvidia`),
    /// `/dev/shm` (NCCL's transport between the GPUs of one machine), the datagram Unix socket and route
    /// netlink NCCL opens, and NCCL told to share memory without Unix sockets ([`nccl`]).
    pub gpu: bool,
    pub network: Network,
    pub limits: Limits,
}

/// The TCP a confined process may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Network {
    /// None at all (a model check).
    #[default]
    None,
    /// A rank's all-reduce: bind and connect ephemeral ports (the ring's listeners, NCCL's), plus these
    /// (the rendezvous port).
    Ring { ports: Vec<u16> },
}

/// What happens where the kernel cannot confine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// Refuse to go on (the default: tenant code never runs unconfined by accident).
    Required,
    /// Confine what the kernel allows and say what is missing (`--allow-unsandboxed`: single-team
    /// installs on kernels without Landlock or seccomp).
    BestEffort,
}

/// What [`enter`] applied: the confined process's first log line.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The Landlock ABI the rules were made for; `None` when the kernel has no Landlock.
    pub landlock_abi: Option<i32>,
    /// Whether TCP is confined (Landlock ABI 4 and later).
    pub network_confined: bool,
    /// Whether abstract Unix sockets (and signals) are scoped to the process (Landlock ABI 6 and later).
    pub sockets_scoped: bool,
    pub seccomp: bool,
    pub limits: Limits,
    /// Readable and writable paths, as given.
    pub read: usize,
    pub write: usize,
    /// Inherited file descriptors closed (beyond stdio and those passed on purpose).
    pub closed_fds: usize,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.landlock_abi {
            Some(abi) => {
                write!(f, "sandbox: Landlock ABI {abi} ({} inputs read, {} folders written", self.read, self.write)?
            }
            None => write!(f, "sandbox: NO Landlock (files are not confined")?,
        }
        write!(f, "; TCP {}", if self.network_confined { "confined" } else { "NOT confined" })?;
        write!(f, ", abstract sockets {})", if self.sockets_scoped { "scoped" } else { "NOT scoped" })?;
        write!(f, ", seccomp {}", if self.seccomp { "on" } else { "OFF" })?;
        write!(f, ", limits: {}", self.limits)?;
        if self.closed_fds > 0 {
            write!(f, ", {} inherited descriptors closed", self.closed_fds)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("this kernel cannot confine tenant code: {0} (an operator may pass --allow-unsandboxed on a single-team install)")]
    Unsupported(String),
    #[error("cannot confine this process: {0}")]
    Failed(String),
}

fn failed(what: &str, err: impl std::fmt::Display) -> SandboxError {
    SandboxError::Failed(format!("{what}: {err}"))
}

/// Confines the calling process for the rest of its life, as `confinement` says. Must come first: before
/// any thread is started (Landlock confines the calling thread and those it starts later) and before any
/// tenant file is opened.
pub fn enter(confinement: &Confinement, enforcement: Enforcement) -> Result<Applied, SandboxError> {
    let threads = std::fs::read_dir("/proc/self/task").map(Iterator::count).unwrap_or(1);
    if threads > 1 {
        return Err(SandboxError::Failed(format!(
            "the process already runs {threads} threads: confinement must come before any thread starts"
        )));
    }
    let closed_fds = launch::close_inherited_descriptors(confinement)?;
    limits::apply(&confinement.limits)?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| failed("not dumpable", e))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| failed("no new privileges", e))?;
    let support = support::probe();
    if confinement.gpu && !support.can_scope_sockets() && enforcement == Enforcement::Required {
        return Err(SandboxError::Unsupported(support::NO_SOCKET_SCOPE.into()));
    }
    if confinement.gpu {
        nccl::without_unix_sockets_between_ranks();
    }
    let landlock = filesystem::restrict(confinement, &support)?;
    if landlock.is_none() && enforcement == Enforcement::Required {
        return Err(SandboxError::Unsupported("the kernel has no Landlock (Linux 5.13 or later)".into()));
    }
    let seccomp = match syscalls::install(confinement) {
        Ok(()) => true,
        Err(err) if enforcement == Enforcement::BestEffort => {
            let _ = err;
            false
        }
        Err(err) => return Err(SandboxError::Unsupported(format!("seccomp: {err}"))),
    };
    Ok(Applied {
        landlock_abi: landlock,
        network_confined: landlock.is_some_and(|abi| abi >= 4),
        sockets_scoped: landlock.is_some_and(|abi| abi >= 6),
        seccomp,
        limits: confinement.limits.clone(),
        read: confinement.read.len(),
        write: confinement.write.len(),
        closed_fds,
    })
}
