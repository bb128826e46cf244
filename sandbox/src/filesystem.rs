//! The Landlock half of the sandbox: which files and TCP ports a confined process may use. Everything not
//! granted here is refused by the kernel, whatever the Unix permissions say: another job's folder, the
//! agent's token, the server's database, `$HOME`, `/proc` of other processes.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::support::Support;
use crate::{failed, Confinement, Network, SandboxError};

/// The newest Landlock ABI these rules were written and tested for (this project's machines run ABI 7).
const TESTED_ABI: ABI = ABI::V7;

/// What the dynamic loader, libtorch and its thread pools read, on every host.
const SYSTEM_READ: &[&str] = &[
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/proc/cpuinfo",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
];

/// Device files any process may write.
const SYSTEM_WRITE_FILES: &[&str] = &["/dev/null"];

/// What CUDA, NVML and NCCL read on a GPU host (topology, driver state, their configuration).
const GPU_READ: &[&str] = &["/sys", "/proc/driver/nvidia", "/etc/nccl.conf"];

/// NCCL's shared-memory transport between the GPUs of one machine.
const GPU_WRITE_FOLDERS: &[&str] = &["/dev/shm"];

/// Applies the rules; returns the ABI they were applied with, or `None` when this kernel has no Landlock.
pub(crate) fn restrict(confinement: &Confinement, support: &Support) -> Result<Option<i32>, SandboxError> {
    if support.landlock_abi <= 0 {
        return Ok(None);
    }
    let abi = TESTED_ABI;
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let write = read
        | AccessFs::WriteFile
        | AccessFs::RemoveDir
        | AccessFs::RemoveFile
        | AccessFs::MakeDir
        | AccessFs::MakeReg
        | AccessFs::Refer
        | AccessFs::Truncate;
    // Handled (so refused unless a rule grants it) is every right of the ABI: executing, making links,
    // devices, sockets and pipes are granted nowhere.
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| failed("Landlock", e))?;
    if support.landlock_abi >= 4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(ABI::V4)).map_err(|e| failed("Landlock", e))?;
    }
    if support.landlock_abi >= 6 {
        // Abstract Unix sockets and signals are scoped to this process's own domain, GPU ranks' too: each
        // NCCL communicator binds an abstract socket for its proxy, but its peers send to it only when
        // NCCL shares memory through cuMem handles, which the sandbox turns off (`crate::nccl`). So no
        // rank reaches another's socket, of another job or of its own.
        ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(|e| failed("Landlock", e))?;
    }
    let mut created = ruleset.create().map_err(|e| failed("Landlock", e))?;

    let mut grants: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    let system = SYSTEM_READ.iter().map(PathBuf::from).chain(library_folders()).chain(own_proc());
    grants.extend(system.map(|p| (p, read)));
    grants
        .extend(SYSTEM_WRITE_FILES.iter().map(|p| (PathBuf::from(p), read | AccessFs::WriteFile | AccessFs::Truncate)));
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        grants.push((exe, read));
    }
    if confinement.gpu {
        grants.extend(GPU_READ.iter().map(|p| (PathBuf::from(p), read)));
        grants.extend(GPU_WRITE_FOLDERS.iter().map(|p| (PathBuf::from(p), write)));
        grants.extend(nvidia_devices().into_iter().map(|p| (p, read | AccessFs::WriteFile | AccessFs::IoctlDev)));
    }
    grants.extend(confinement.read.iter().map(|p| (p.clone(), read)));
    grants.extend(confinement.write.iter().map(|p| (p.clone(), write)));
    for (path, access) in grants {
        // A system path this host lacks is skipped; the process's own inputs must exist.
        let Ok(fd) = PathFd::new(&path) else {
            if confinement.read.contains(&path) || confinement.write.contains(&path) {
                return Err(failed("Landlock", format!("{} cannot be opened", path.display())));
            }
            continue;
        };
        let access = if path.is_dir() { access } else { access & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(|e| failed("Landlock", e))?;
    }
    if support.landlock_abi >= 4 {
        if let Network::Ring { ports } = &confinement.network {
            created = created
                .add_rules(
                    ring_ports(ports).map(|(port, access)| Ok::<_, landlock::RulesetError>(NetPort::new(port, access))),
                )
                .map_err(|e| failed("Landlock", e))?;
        }
    }
    let status = created.restrict_self().map_err(|e| failed("Landlock", e))?;
    match status.ruleset {
        RulesetStatus::NotEnforced => Ok(None),
        _ => Ok(Some(support.landlock_abi)),
    }
}

/// The TCP ports of a rank: bind an ephemeral port (a rule for port 0) or a named one; connect to the
/// ephemeral range (the other ranks' listeners) and the named ones. Not Postgres, not the API, nothing
/// else listening on a fixed port of this host or another.
fn ring_ports(named: &[u16]) -> impl Iterator<Item = (u16, BitFlags<AccessNet>)> + '_ {
    let (low, high) = ephemeral_range();
    let bind = std::iter::once(0).chain(named.iter().copied()).map(|p| (p, BitFlags::from(AccessNet::BindTcp)));
    let connect = (low..=high).filter(move |p| !named.contains(p)).map(|p| (p, BitFlags::from(AccessNet::ConnectTcp)));
    let both = named.iter().map(|&p| (p, AccessNet::BindTcp | AccessNet::ConnectTcp));
    bind.filter(|(p, _)| *p == 0).chain(both).chain(connect)
}

/// `net.ipv4.ip_local_port_range` (the kernel's default when it cannot be read).
pub fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut numbers = text.split_whitespace().filter_map(|n| n.parse::<u16>().ok());
    match (numbers.next(), numbers.next()) {
        (Some(low), Some(high)) if low <= high && low > 0 => (low, high),
        _ => (32768, 60999),
    }
}

/// The folders of the shared libraries this process has mapped (libtorch's, wherever it lives) and those
/// `LD_LIBRARY_PATH` names (NCCL and the CUDA runtime are loaded later, with `dlopen`).
fn library_folders() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mapped = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/') && path.contains(".so"))
        .filter_map(|path| Path::new(path).parent().map(Path::to_path_buf));
    let searched = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .collect::<Vec<_>>();
    let mut folders: Vec<PathBuf> = mapped.chain(searched).collect();
    folders.sort();
    folders.dedup();
    folders
}

/// `/proc/self` as the path it stands for (`/proc/PID`): this process's own entries, none of another's.
fn own_proc() -> Option<PathBuf> {
    let pid = std::fs::read_link("/proc/self").ok()?;
    Some(Path::new("/proc").join(pid))
}

fn nvidia_devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/dev") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_bind_ephemeral_ports_and_connect_only_to_them_and_the_rendezvous() {
        let (low, high) = ephemeral_range();
        let rules: Vec<_> = ring_ports(&[45000]).collect();
        assert!(rules.contains(&(0, AccessNet::BindTcp.into())));
        assert!(rules.contains(&(45000, AccessNet::BindTcp | AccessNet::ConnectTcp)));
        assert!(rules.iter().all(|(p, _)| *p == 0 || (low..=high).contains(p)), "no fixed port");
        assert!(!rules.iter().any(|(p, _)| *p == 5432 || *p == 8080));
        assert_eq!(rules.iter().filter(|(p, _)| *p == 45000).count(), 1);
    }

    #[test]
    fn the_libraries_this_process_maps_are_found() {
        let folders = library_folders();
        assert!(folders.iter().any(|f| f.join("libc.so.6").exists()), "{folders:?}");
    }
}
