//! Resource limits of a confined process (setrlimit): what one hostile file may take of its host when no
//! cgroup bounds it, and no core dump of a process that held another team's gradients.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use serde::{Deserialize, Serialize};

use crate::{failed, SandboxError};

/// `None` leaves a limit as inherited. The core size is always 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// The largest file it may write (a checkpoint's largest file, with room).
    pub file_bytes: Option<u64>,
    pub open_files: Option<u64>,
    /// Processes and threads of its user (not enforced for root).
    pub processes: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub address_space_bytes: Option<u64>,
}

impl Limits {
    /// A model check: two samples through forward and backward, on the server's host.
    pub fn model_check(max_memory_bytes: u64, cpu_seconds: u64) -> Limits {
        Limits {
            file_bytes: Some(64 << 20),
            open_files: Some(256),
            processes: None,
            cpu_seconds: Some(cpu_seconds),
            address_space_bytes: Some(max_memory_bytes),
        }
    }

    /// A rank: checkpoints up to `file_bytes`, threads for libtorch, OpenMP and NCCL.
    pub fn rank(file_bytes: u64) -> Limits {
        Limits {
            file_bytes: Some(file_bytes),
            open_files: Some(4096),
            processes: Some(4096),
            cpu_seconds: None,
            address_space_bytes: None,
        }
    }
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| format!("{} MiB", b >> 20);
        let mut parts = vec!["no core".to_string()];
        if let Some(b) = self.file_bytes {
            parts.push(format!("files up to {}", mib(b)));
        }
        if let Some(n) = self.open_files {
            parts.push(format!("{n} open files"));
        }
        if let Some(n) = self.processes {
            parts.push(format!("{n} threads"));
        }
        if let Some(s) = self.cpu_seconds {
            parts.push(format!("{s} s of CPU"));
        }
        if let Some(b) = self.address_space_bytes {
            parts.push(format!("{} of address space", mib(b)));
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// Sets both the soft and the hard limit (the process cannot raise it again), never above the hard limit
/// it inherited (raising that needs a privilege it may not have).
fn set(resource: Resource, value: u64, name: &str) -> Result<(), SandboxError> {
    let value = getrlimit(resource).maximum.map_or(value, |hard| hard.min(value));
    setrlimit(resource, Rlimit { current: Some(value), maximum: Some(value) }).map_err(|e| failed(name, e))
}

pub(crate) fn apply(limits: &Limits) -> Result<(), SandboxError> {
    set(Resource::Core, 0, "RLIMIT_CORE")?;
    let wanted = [
        (Resource::Fsize, limits.file_bytes, "RLIMIT_FSIZE"),
        (Resource::Nofile, limits.open_files, "RLIMIT_NOFILE"),
        (Resource::Nproc, limits.processes, "RLIMIT_NPROC"),
        (Resource::Cpu, limits.cpu_seconds, "RLIMIT_CPU"),
        (Resource::As, limits.address_space_bytes, "RLIMIT_AS"),
    ];
    for (resource, value, name) in wanted {
        if let Some(value) = value {
            set(resource, value, name)?;
        }
    }
    Ok(())
}
