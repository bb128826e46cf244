//! How this agent confines the ranks it starts (the parent's half of [`ringtrain_sandbox`]): checked once
//! at start (the kernel can confine, the rank user exists and can run the binary, the token file is the
//! agent's alone), then applied to each rank: a private folder the rank user owns, its inputs passed as
//! open files, an allow-listed environment, its cgroup.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ringtrain_sandbox::cgroup::{Cgroup, Hierarchy};
use ringtrain_sandbox::{Launch, RankUser};

/// What every rank of this agent is confined by.
#[derive(Debug, Clone)]
pub struct RankSandbox {
    /// The account ranks run as (where the agent is root).
    pub user: Option<RankUser>,
    /// Ranks may run where the kernel cannot confine them.
    pub allow_unsandboxed: bool,
    pub cgroups: Hierarchy,
    /// Each rank's memory limit (its slot and the runtime: `devices::rank_memory`).
    pub memory_bytes: Option<u64>,
}

/// Threads (and processes) one rank may have: libtorch's and OpenMP's pools, NCCL's, with room.
const RANK_THREADS: u64 = 1024;

impl RankSandbox {
    /// Checks what ranks need, at the agent's start: a kernel that confines (unless `allow_unsandboxed`),
    /// and, where the agent is root, a rank user that can run `exe`.
    pub fn prepare(
        rank_user: Option<&str>,
        allow_unsandboxed: bool,
        exe: &Path,
        memory_bytes: Option<u64>,
        offers_gpus: bool,
    ) -> Result<RankSandbox> {
        let support = ringtrain_sandbox::probe();
        if !support.can_confine() && !allow_unsandboxed {
            bail!(
                "this node cannot confine tenant code (it lacks {}): ranks would run unconfined; on a \
                 single-team install pass --allow-unsandboxed",
                support.missing().join(" and ")
            );
        }
        if offers_gpus && !support.can_scope_sockets() && !allow_unsandboxed {
            bail!(
                "this node cannot confine GPU ranks: {}; offer only CPUs here, or on a single-team install \
                 pass --allow-unsandboxed",
                ringtrain_sandbox::support::NO_SOCKET_SCOPE
            );
        }
        let user = RankUser::for_tenant_code(support.root, rank_user).map_err(anyhow::Error::msg)?;
        if let Some(user) = &user {
            can_run(user, exe)?;
        }
        tracing::info!(sandbox = %support, rank_user = user.as_ref().map_or("this agent's", |u| u.name.as_str()), "ranks are confined");
        Ok(RankSandbox { user, allow_unsandboxed, cgroups: support.cgroup, memory_bytes })
    }

    /// A rank's private folder, made where the agent keeps the placement: only the rank's user may enter it.
    pub fn private_folder(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir.join("out")).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(user) = &self.user {
            user.own(dir)?;
            user.own(&dir.join("out"))?;
        }
        Ok(())
    }

    /// The launch of one rank: its folder and inputs passed open, its user, its cgroup (returned: it is
    /// removed when dropped, after the rank).
    pub fn launch(&self, name: &str) -> Result<(Launch, Option<Cgroup>)> {
        let mut launch = Launch::new();
        launch.run_as(self.user.clone());
        let group = Cgroup::create(&self.cgroups, name, self.memory_bytes, Some(RANK_THREADS))
            .with_context(|| format!("cannot make the rank's cgroup under {}", self.cgroups))?;
        if let Some(group) = &group {
            launch.join_cgroup(group.procs_files()?);
        }
        Ok((launch, group))
    }
}

/// Passes `path` (a file, or a folder) to the rank open; the path the rank opens it by.
pub fn pass(launch: &mut Launch, path: &Path) -> Result<PathBuf> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(launch.pass(file))
}

/// The rank user must be able to run the binary and load libtorch (a binary under root's home cannot be):
/// `ringtrain --version` as that user.
fn can_run(user: &RankUser, exe: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let output = std::process::Command::new(exe)
        .arg("--version")
        .uid(user.uid)
        .gid(user.gid)
        .current_dir("/")
        .env_clear()
        .envs(ringtrain_sandbox::allowed_environment(std::env::vars()))
        .output();
    match output {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => bail!(
            "the rank user {} cannot run {}: {} (install ringtrain and libtorch where it can read them, e.g. \
             /usr/local/bin and /opt)",
            user.name,
            exe.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(err) => bail!(
            "the rank user {} cannot run {}: {err} (install it where that user can read it)",
            user.name,
            exe.display()
        ),
    }
}

/// A token file must be the agent's alone (like ssh's keys): refused when its group or others may read it.
pub fn check_token_file(path: &Path) -> Result<()> {
    let mode = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!("{} may be read by other users (mode {:o}): chmod 600 it", path.display(), mode & 0o777);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("agent-token");
        std::fs::write(&token, "rt_x").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check_token_file(&token).unwrap_err().to_string().contains("chmod 600"));
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_token_file(&token).is_ok());
    }
}
