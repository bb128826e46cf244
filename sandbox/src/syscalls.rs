//! The seccomp half of the sandbox: system calls that training never makes are refused (EPERM), on every
//! thread. A deny-list, not an allow-list: libtorch, OpenMP, glibc and NCCL between them make hundreds of
//! calls that change between versions, and an allow-list that misses one kills a healthy rank; what is
//! denied here is what turns code execution inside a rank into more (another process's memory, the
//! kernel's attack surface, a way out of Landlock's domain).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use crate::{Confinement, Network};

/// Refused outright, whatever their arguments.
const DENIED: &[(&str, libc::c_long)] = &[
    // other processes' memory and state
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kcmp", libc::SYS_kcmp),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    // running another program, or a copy of this one outside the rank's threads
    ("execve", libc::SYS_execve),
    ("execveat", libc::SYS_execveat),
    ("fork", libc::SYS_fork),
    ("vfork", libc::SYS_vfork),
    // file systems, namespaces, the kernel itself
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("vhangup", libc::SYS_vhangup),
    ("personality", libc::SYS_personality),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
];

/// The namespace flags of clone(2): a rank starts threads, never containers.
const CLONE_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// The socket families a rank's all-reduce uses: TCP over IPv4 or IPv6. A CPU rank opens no Unix socket at
/// all (its peers on the same machine share memory through a passed `memfd`), so none can reach a service
/// listening on a socket file (Postgres's `/var/run/postgresql/.s.PGSQL.5432`, D-Bus, a container engine)
/// or an abstract socket: Landlock's file rules do not cover connecting to a socket file, this does.
const RING_FAMILIES: &[u64] = &[libc::AF_INET as u64, libc::AF_INET6 as u64];

/// What a GPU rank's NCCL needs beyond TCP, and nothing more:
/// - `AF_UNIX` of type `SOCK_DGRAM` only: every NCCL communicator binds one abstract datagram socket for
///   its proxy thread (`ncclProxyInit`). Peers would send it file descriptors only when NCCL shares GPU
///   memory through cuMem handles, which the sandbox turns off ([`crate::nccl`]); Landlock scopes abstract
///   sockets to the rank's own domain. Stream and seqpacket sockets (what Postgres, D-Bus, container
///   engines and ssh agents listen on) are refused.
/// - `AF_NETLINK` with `NETLINK_ROUTE` only: NCCL lists the host's interfaces with `getifaddrs(3)` before
///   its bootstrap, and fails without them. Unprivileged, that protocol reads addresses and routes; it
///   changes nothing.
const GPU_UNIX_STREAM_TYPES: &[u64] = &[libc::SOCK_STREAM as u64, libc::SOCK_SEQPACKET as u64];

/// The low bits of socket(2)'s type argument: the type without `SOCK_NONBLOCK` and `SOCK_CLOEXEC`.
const SOCKET_TYPE_MASK: u64 = 0xf;

/// The names of the calls refused outright (for the documentation and `doctor`).
pub fn denied_names() -> impl Iterator<Item = &'static str> {
    DENIED.iter().map(|(name, _)| *name)
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("{e}"))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

fn condition(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| e.to_string())
}

/// The filter that answers EPERM.
fn denials(confinement: &Confinement) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    // clone with any namespace flag, or without CLONE_THREAD (a new process: glibc's fork and
    // posix_spawn): a rank starts threads, never processes or containers
    let thread = libc::CLONE_THREAD as u64;
    let mut clone_rules = vec![rule(vec![condition(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(thread), 0)?])?];
    for &flag in CLONE_NAMESPACES {
        clone_rules.push(rule(vec![condition(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // socket(2) of another family than the ring's (or any, for a check)
    let socket_rule = match confinement.network {
        Network::None => Vec::new(),
        Network::Ring { .. } => refused_sockets(confinement.gpu)?,
    };
    rules.insert(libc::SYS_socket, socket_rule);
    // socketpair(2) makes Unix sockets, and a datagram one may still send to any socket file by name
    // (sendto with an address): refused where Unix sockets are. A GPU rank may make datagram Unix
    // sockets anyway, so a pair gives it nothing more; it is left to CUDA's closed driver, whose needs
    // are not all documented.
    if !confinement.gpu {
        rules.insert(libc::SYS_socketpair, Vec::new());
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch()?)
        .map_err(|e| e.to_string())?;
    filter.try_into().map_err(|e: seccompiler::BackendError| e.to_string())
}

/// The rules (any one matches) of a socket(2) call a rank may not make: a family other than TCP's, and
/// for a GPU rank other than NCCL's datagram Unix socket and route netlink.
fn refused_sockets(gpu: bool) -> Result<Vec<SeccompRule>, String> {
    let family = |op, value: i32| condition(0, SeccompCmpArgLen::Dword, op, value as u64);
    let (unix, netlink) = (libc::AF_UNIX, libc::AF_NETLINK);
    let mut allowed: Vec<u64> = RING_FAMILIES.to_vec();
    if gpu {
        allowed.extend([unix as u64, netlink as u64]);
    }
    let other_family = allowed
        .iter()
        .map(|&f| condition(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, f))
        .collect::<Result<_, _>>()?;
    let mut rules = vec![rule(other_family)?];
    if gpu {
        for &kind in GPU_UNIX_STREAM_TYPES {
            rules.push(rule(vec![
                family(SeccompCmpOp::Eq, unix)?,
                condition(1, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(SOCKET_TYPE_MASK), kind)?,
            ])?);
        }
        rules.push(rule(vec![
            family(SeccompCmpOp::Eq, netlink)?,
            condition(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?);
    }
    Ok(rules)
}

/// clone3(2) takes its flags in memory, where seccomp cannot look: it answers ENOSYS, and glibc falls back
/// to clone(2), whose flags the filter above reads.
fn no_clone3() -> Result<BpfProgram, String> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch()?)
        .map_err(|e| e.to_string())?;
    filter.try_into().map_err(|e: seccompiler::BackendError| e.to_string())
}

/// Installs both filters on every thread of the process.
pub(crate) fn install(confinement: &Confinement) -> Result<(), String> {
    for program in [no_clone3()?, denials(confinement)?] {
        seccompiler::apply_filter_all_threads(&program).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_filters_compile_for_this_machine() {
        assert!(denials(&Confinement::default()).is_ok());
        let ring = Confinement { network: Network::Ring { ports: vec![] }, ..Default::default() };
        assert!(denials(&ring).is_ok());
        let gpu = Confinement { gpu: true, ..ring };
        assert!(denials(&gpu).is_ok());
        assert!(no_clone3().is_ok());
        assert!(denied_names().any(|n| n == "ptrace"));
    }
}
