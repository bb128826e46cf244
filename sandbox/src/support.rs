//! What this kernel and process can do to confine tenant code: for `ringtrain doctor`, for the agent and
//! the server at start (they refuse tenant code where they cannot confine it), and for [`crate::enter`].

#![allow(unsafe_code)]

use serde::Serialize;

/// Why a GPU rank is refused where Landlock cannot scope abstract Unix sockets.
pub const NO_SOCKET_SCOPE: &str =
    "GPU ranks need Landlock ABI 6 (Linux 6.12 or later) to keep them from other processes' \
     abstract Unix sockets; this kernel's Landlock is older";

#[derive(Debug, Clone, Serialize)]
pub struct Support {
    /// The kernel's Landlock ABI version; 0 when it has none (or it is disabled).
    pub landlock_abi: i32,
    /// seccomp filters (`Seccomp_filters` in /proc/self/status).
    pub seccomp: bool,
    /// Running as root: ranks and checks can run as an unprivileged user of their own.
    pub root: bool,
    /// Where per-placement limits can be set.
    pub cgroup: crate::cgroup::Hierarchy,
}

impl Support {
    /// Everything [`crate::enter`] needs in order to confine.
    pub fn can_confine(&self) -> bool {
        self.landlock_abi > 0 && self.seccomp
    }

    /// Whether Landlock can scope abstract Unix sockets (ABI 6, Linux 6.12): what keeps a GPU rank, which
    /// may open datagram Unix sockets for NCCL, from reaching another process's abstract socket. CPU ranks
    /// and checks open no Unix socket at all and do not need it.
    pub fn can_scope_sockets(&self) -> bool {
        self.landlock_abi >= 6
    }

    /// What is missing, in words.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if self.landlock_abi <= 0 {
            missing.push("Landlock (Linux 5.13 or later, with landlock in the lsm= list)".to_string());
        }
        if !self.seccomp {
            missing.push("seccomp filters".to_string());
        }
        missing
    }
}

impl std::fmt::Display for Support {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.landlock_abi {
            abi if abi > 0 => {
                let covers = match abi {
                    6.. => " (files, TCP, abstract sockets)",
                    4 | 5 => " (files and TCP)",
                    _ => " (files only)",
                };
                write!(f, "Landlock ABI {abi}{covers}")?
            }
            _ => write!(f, "no Landlock")?,
        }
        write!(f, ", seccomp {}", if self.seccomp { "yes" } else { "no" })?;
        write!(f, ", {}", self.cgroup)?;
        write!(
            f,
            ", {}",
            if self.root {
                "root (tenant code runs as --rank-user)"
            } else {
                "not root (tenant code runs as this user)"
            }
        )
    }
}

/// The kernel's Landlock ABI version (0: none). `landlock_create_ruleset(NULL, 0, VERSION)` asks for it
/// without creating anything.
fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the call reads and writes no
    // memory; it returns the ABI version or -1.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

fn seccomp_filters() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Seccomp_filters:") || l.starts_with("Seccomp:"))
}

pub fn probe() -> Support {
    Support {
        landlock_abi: landlock_abi(),
        seccomp: seccomp_filters(),
        root: rustix::process::geteuid().is_root(),
        cgroup: crate::cgroup::Hierarchy::detect(),
    }
}
