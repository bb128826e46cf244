//! The parent's half of the sandbox: how a confined process is started. Its inputs are passed as open
//! files (it opens them as `/proc/self/fd/N`, so it needs no permission on the folders of the agent or
//! the server, which stay private to them), its environment is allow-listed, it runs as the rank user
//! where the parent is root, its working folder is its private one, and it joins its cgroup before its
//! first instruction. The child then confines itself with [`crate::enter`].

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{failed, Confinement, RankUser, SandboxError};

/// The first descriptor number passed files get in the child (after stdin, stdout and stderr).
const FIRST_PASSED: RawFd = 3;

/// What to do to a command before it spawns.
#[derive(Debug, Default)]
pub struct Launch {
    passed: Vec<OwnedFd>,
    cgroup_procs: Vec<OwnedFd>,
    user: Option<RankUser>,
    private_dir: Option<PathBuf>,
}

/// The path a passed descriptor has in the child.
pub fn passed_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// The descriptor a `/proc/self/fd/N` path names, if it names one.
fn passed_fd(path: &Path) -> Option<RawFd> {
    path.strip_prefix("/proc/self/fd").ok()?.components().next()?.as_os_str().to_str()?.parse().ok()
}

impl Launch {
    pub fn new() -> Launch {
        Launch::default()
    }

    /// Passes `file` (a file, or a folder opened as one) to the child; returns the path the child opens
    /// it by.
    pub fn pass(&mut self, file: impl Into<OwnedFd>) -> PathBuf {
        self.passed.push(file.into());
        passed_path(FIRST_PASSED + self.passed.len() as RawFd - 1)
    }

    /// The child joins these groups (each folder's `cgroup.procs`, open for writing) before it execs.
    pub fn join_cgroup(&mut self, procs: Vec<OwnedFd>) {
        self.cgroup_procs.extend(procs);
    }

    /// The child runs as `user` (with no supplementary groups).
    pub fn run_as(&mut self, user: Option<RankUser>) {
        self.user = user;
    }

    /// The child's working folder, `HOME` and `TMPDIR`: its private folder (a path the child can reach,
    /// such as a passed folder's `/proc/self/fd/N`).
    pub fn private_dir(&mut self, dir: PathBuf) {
        self.private_dir = Some(dir);
    }

    /// Configures `command`: environment, user, working folder, passed files and cgroup.
    pub fn apply(self, command: &mut Command) -> Result<(), SandboxError> {
        command.env_clear().envs(crate::allowed_environment(std::env::vars()));
        if let Some(dir) = &self.private_dir {
            command.env("HOME", dir).env("TMPDIR", dir);
        }
        if let Some(user) = &self.user {
            command.uid(user.uid).gid(user.gid);
        }
        // Sources must not sit where targets go, or one dup2 would overwrite a file another still needs.
        let last_target = FIRST_PASSED + self.passed.len() as RawFd;
        let sources: Vec<OwnedFd> = self
            .passed
            .into_iter()
            .map(|fd| {
                if (FIRST_PASSED..last_target).contains(&fd.as_raw_fd()) {
                    rustix::io::fcntl_dupfd_cloexec(&fd, last_target).map_err(|e| failed("passing a file", e))
                } else {
                    Ok(fd)
                }
            })
            .collect::<Result<_, _>>()?;
        let cgroups = self.cgroup_procs;
        let private = self.private_dir.as_ref().and_then(|d| passed_fd(d));
        // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls
        // are allowed: it makes only dup2, write and fchdir system calls on descriptors the parent keeps
        // open (the closure owns them until the command is dropped), allocates nothing, takes no lock.
        unsafe {
            command.pre_exec(move || {
                for (i, source) in sources.iter().enumerate() {
                    // dup2 clears close-on-exec on the copy: it alone survives the exec
                    if libc::dup2(source.as_raw_fd(), FIRST_PASSED + i as RawFd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for procs in &cgroups {
                    if libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(fd) = private {
                    if libc::fchdir(fd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// Closes every descriptor the process inherited beyond stdin, stdout, stderr and those the
/// confinement names (`/proc/self/fd/N` paths): nothing of the parent's stays reachable. Returns how
/// many it closed.
pub(crate) fn close_inherited_descriptors(confinement: &Confinement) -> Result<usize, SandboxError> {
    let kept: Vec<RawFd> = confinement.read.iter().chain(&confinement.write).filter_map(|p| passed_fd(p)).collect();
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| failed("listing /proc/self/fd", e))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // (one of them was the listing's own descriptor, closed by now: closing it again fails harmlessly)
    let mut closed = 0;
    for fd in open.into_iter().filter(|fd| *fd > 2 && !kept.contains(fd)) {
        // SAFETY: the process is single-threaded here (checked by `enter`) and nothing of this process
        // owns these descriptors: they were inherited, not opened by Rust code that would close them again.
        if unsafe { libc::close(fd) } == 0 {
            closed += 1;
        }
    }
    Ok(closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_paths_name_their_descriptor() {
        assert_eq!(passed_fd(&passed_path(7)), Some(7));
        assert_eq!(passed_fd(Path::new("/proc/self/fd/4/out")), Some(4));
        assert_eq!(passed_fd(Path::new("/tmp/x")), None);
        let mut launch = Launch::new();
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(launch.pass(file), PathBuf::from("/proc/self/fd/3"));
    }
}
