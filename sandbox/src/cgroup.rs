//! A cgroup per confined process: its memory (from the job's estimate) and its threads, bounded by the
//! kernel, so that a model that allocates without end is killed alone instead of making the kernel's OOM
//! killer pick another team's rank. cgroup v2 where the agent's cgroup is delegated to it (systemd
//! `Delegate=yes`), else v1's memory and pids hierarchies (this project's machines have only v1), else
//! nothing: the rank's rlimits stay, and its first log line says so.
//!
//! The parent creates the group and opens its `cgroup.procs` for writing; the child writes `0` to it
//! between fork and exec ([`crate::Launch::join_cgroup`]), so it is bounded before its first instruction.
//! (The kernel checks the permission of the opener, so this works after the child dropped to the rank
//! user.)

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

const V2_ROOT: &str = "/sys/fs/cgroup";
/// The folder under the agent's own cgroup that holds one group per confined process.
const GROUP_FOLDER: &str = "ringtrain";

/// Where groups can be made.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub enum Hierarchy {
    /// The agent's own v2 cgroup, with memory and pids for its children.
    V2 { base: PathBuf },
    /// The agent's v1 memory and pids cgroups.
    V1 { memory: PathBuf, pids: PathBuf },
    /// No limits can be set; why.
    Unavailable { why: String },
}

impl std::fmt::Display for Hierarchy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hierarchy::V2 { base } => write!(f, "cgroup v2 limits (memory, pids) under {}", base.display()),
            Hierarchy::V1 { memory, .. } => write!(f, "cgroup v1 limits (memory, pids) under {}", memory.display()),
            Hierarchy::Unavailable { why } => write!(f, "no cgroup limits ({why}; rlimits only)"),
        }
    }
}

/// This process's cgroup path in the hierarchy `controller` names ("" for v2's unified one).
fn own_path(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| path.trim_start_matches('/').to_string())
    })
}

fn writable_dir(path: &Path) -> bool {
    path.is_dir() && rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok()
}

impl Hierarchy {
    pub fn detect() -> Hierarchy {
        if let Some(base) = Self::v2() {
            return Hierarchy::V2 { base };
        }
        let v1 = |controller: &str| {
            let path = Path::new(V2_ROOT).join(controller).join(own_path(controller)?);
            writable_dir(&path).then_some(path)
        };
        match (v1("memory"), v1("pids")) {
            (Some(memory), Some(pids)) => Hierarchy::V1 { memory, pids },
            _ if Path::new(V2_ROOT).join("cgroup.controllers").exists() => Hierarchy::Unavailable {
                why: "this process's cgroup v2 is not delegated to it with memory and pids".into(),
            },
            _ => Hierarchy::Unavailable { why: "no writable cgroup v1 memory and pids hierarchy".into() },
        }
    }

    /// The v2 base: this process's cgroup when it may give its children memory and pids limits. (A v2
    /// group with processes cannot have limited children: the agent's unit must delegate, and the agent
    /// moves itself into a leaf `agent` beside the groups it makes.)
    fn v2() -> Option<PathBuf> {
        let root = Path::new(V2_ROOT);
        if !root.join("cgroup.controllers").exists() {
            return None;
        }
        let base = root.join(own_path("")?);
        let controllers = std::fs::read_to_string(base.join("cgroup.controllers")).ok()?;
        let offered = |c: &str| controllers.split_whitespace().any(|x| x == c);
        if !(offered("memory") && offered("pids") && writable_dir(&base)) {
            return None;
        }
        let enabled = |base: &Path| {
            let subtree = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
            ["memory", "pids"].iter().all(|c| subtree.split_whitespace().any(|x| x == *c))
        };
        if !enabled(&base) {
            // the delegation dance: into a leaf, then turn the controllers on for the children
            let leaf = base.join("agent");
            std::fs::create_dir_all(&leaf).ok()?;
            std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).ok()?;
            std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids").ok()?;
        }
        enabled(&base).then_some(base)
    }
}

/// One confined process's group (several folders on v1), removed on drop once its processes are gone.
#[derive(Debug)]
pub struct Cgroup {
    folders: Vec<PathBuf>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
}

impl Cgroup {
    /// Makes the group `name` (e.g. the job, attempt and rank) with these limits; `None` where the
    /// hierarchy offers none.
    pub fn create(
        hierarchy: &Hierarchy,
        name: &str,
        memory_bytes: Option<u64>,
        pids: Option<u64>,
    ) -> std::io::Result<Option<Cgroup>> {
        let (folders, memory_file, pids_file) = match hierarchy {
            Hierarchy::V2 { base } => {
                let folder = base.join(GROUP_FOLDER).join(name);
                (vec![folder.clone()], folder.join("memory.max"), folder.join("pids.max"))
            }
            Hierarchy::V1 { memory, pids: pids_base } => {
                let (m, p) = (memory.join(GROUP_FOLDER).join(name), pids_base.join(GROUP_FOLDER).join(name));
                (vec![m.clone(), p.clone()], m.join("memory.limit_in_bytes"), p.join("pids.max"))
            }
            Hierarchy::Unavailable { .. } => return Ok(None),
        };
        if let Hierarchy::V2 { base } = hierarchy {
            // the folder that holds the groups passes the controllers on to them
            std::fs::create_dir_all(base.join(GROUP_FOLDER))?;
            let _ = std::fs::write(base.join(GROUP_FOLDER).join("cgroup.subtree_control"), "+memory +pids");
        }
        for folder in &folders {
            std::fs::create_dir_all(folder)?;
        }
        let group = Cgroup { folders, memory_bytes, pids };
        if let Some(bytes) = memory_bytes {
            std::fs::write(&memory_file, bytes.to_string())?;
            if matches!(hierarchy, Hierarchy::V2 { .. }) {
                // no swap to hide in: the limit is the memory it may use
                let _ = std::fs::write(memory_file.with_file_name("memory.swap.max"), "0");
            }
        }
        if let Some(n) = pids {
            std::fs::write(&pids_file, n.to_string())?;
        }
        Ok(Some(group))
    }

    /// Each folder's `cgroup.procs`, open for writing: what the child writes `0` to as it starts.
    pub fn procs_files(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.folders.iter().map(|f| Ok(OpenOptions::new().write(true).open(f.join("cgroup.procs"))?.into())).collect()
    }

    /// Whether the kernel killed a process of the group for exceeding its memory (v2's `oom_kill`
    /// count, v1's `memory.failcnt` with `under_oom`): the job's doing, not the node's.
    pub fn out_of_memory(&self) -> bool {
        self.folders.iter().any(|f| {
            let events = std::fs::read_to_string(f.join("memory.events")).unwrap_or_default();
            let v2 = events.lines().any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"));
            let control = std::fs::read_to_string(f.join("memory.oom_control")).unwrap_or_default();
            let v1 = control.lines().any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"));
            v2 || v1
        })
    }
}

impl std::fmt::Display for Cgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let memory = self.memory_bytes.map_or("no memory limit".to_string(), |b| format!("memory {} MiB", b >> 20));
        let pids = self.pids.map_or("no thread limit".to_string(), |n| format!("{n} threads"));
        write!(f, "cgroup {memory}, {pids}")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // rmdir succeeds only once the group is empty; a group left behind (a process that outlived its
        // supervisor) is harmless and removed by the next agent start's clean-up
        for folder in &self.folders {
            let _ = std::fs::remove_dir(folder);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_made_with_its_limits_and_removed_when_dropped() {
        let hierarchy = Hierarchy::detect();
        let name = format!("test-{}", std::process::id());
        let Some(group) = Cgroup::create(&hierarchy, &name, Some(256 << 20), Some(64)).unwrap() else {
            eprintln!("no cgroup hierarchy here: {hierarchy}");
            return;
        };
        let folders = group.folders.clone();
        assert!(folders.iter().all(|f| f.is_dir()));
        assert_eq!(group.procs_files().unwrap().len(), folders.len());
        assert!(!group.out_of_memory());
        drop(group);
        assert!(folders.iter().all(|f| !f.exists()));
    }
}
