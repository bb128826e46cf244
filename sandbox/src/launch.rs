//! The parent's half of the sandbox: how a confined process is started. Its inputs are passed as open
//! files (it opens them as `/proc/self/fd/N`, so it needs no permission on the folders of the agent or
//! the server, which stay private to them), its environment is allow-listed, it runs as the rank user
//! where the parent is root, its working folder is its private one, and it joins its cgroup before its
//! first instruction. The child then confines itself with [`crate::enter`].

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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
pub(crate) fn passed_fd(path: &Path) -> Option<RawFd> {
    path.strip_prefix("/proc/self/fd").ok()?.components().next()?.as_os_str().to_str()?.parse().ok()
}

/// A new empty file in memory (a `memfd`), for a launcher to pass to the processes it starts: they share
/// memory through it with no path another process could open (the ranks of one machine all-reduce through
/// it). `inherited`: left open across exec, for a launcher that starts its children without [`Launch`]
/// (which passes descriptors itself); the child finds it at the same number.
pub fn shared_memory_file(inherited: bool) -> std::io::Result<OwnedFd> {
    let flags = if inherited { 0 } else { libc::MFD_CLOEXEC };
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"ringtrain-shared".as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The child's side of [`Launch::pass`] for a descriptor it uses as it is rather than opening its path (a
/// shared memory segment): takes ownership of the descriptor `path` (`/proc/self/fd/N`) names. Call it once
/// per descriptor: the returned handle closes it.
pub fn take_passed(path: &Path) -> std::io::Result<OwnedFd> {
    let invalid =
        |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: {why}", path.display()));
    let fd =
        passed_fd(path).filter(|fd| *fd > 2).ok_or_else(|| invalid("not a passed descriptor (/proc/self/fd/N)"))?;
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails on a descriptor that is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(invalid("no such descriptor is open"));
    }
    // SAFETY: the descriptor is open (above), was inherited rather than opened by this process's code, and
    // the caller takes it once: nothing else owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    let named = confinement.read.iter().chain(&confinement.write).chain(&confinement.kept);
    let kept: Vec<RawFd> = named.filter_map(|p| passed_fd(p)).collect();
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
