//! The ranks' folders on this node (`work_dir/jobs/JOB/attempt-N/rank-R`: a rank's spec, the checkpoint it
//! resumes from, its output and checkpoints). Made before the rank starts; removed once the rank has ended
//! and what it leaves for the server (rank 0's newest checkpoint) got there, so a worker's disk holds the
//! placements running on it and no history. A folder whose checkpoint could not be delivered is kept until
//! the agent next starts, which clears them all: no rank outlives its agent, and the server resumes a job
//! only from the checkpoints it holds.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use ringtrain_core::JobId;
use ringtrain_protocol::Assignment;

use crate::confine::RankSandbox;

#[derive(Debug)]
pub(crate) struct RankFolders {
    root: PathBuf,
    /// Made and removed one at a time: a rank of the job's next placement may be making its folder under
    /// the job's while the last rank of the previous one removes the job's emptied folder.
    changing: Mutex<()>,
}

impl RankFolders {
    pub fn new(work_dir: &Path) -> RankFolders {
        RankFolders { root: work_dir.join("jobs"), changing: Mutex::new(()) }
    }

    /// The folder of `assignment`'s rank.
    pub fn of(&self, assignment: &Assignment) -> PathBuf {
        self.rank_folder(assignment.job_id, assignment.attempt, assignment.rank)
    }

    fn rank_folder(&self, job: JobId, attempt: i32, rank: i32) -> PathBuf {
        self.root.join(job.to_string()).join(format!("attempt-{attempt}")).join(format!("rank-{rank}"))
    }

    /// Makes the rank's folder, its own user's alone.
    pub fn make(&self, rank_dir: &Path, sandbox: &RankSandbox) -> Result<()> {
        let _changing = self.changing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        sandbox.private_folder(rank_dir)
    }

    /// Removes the rank's folder, then its placement's and its job's when they are left empty; returns the
    /// bytes freed.
    pub fn remove(&self, rank_dir: &Path) -> Result<u64> {
        let _changing = self.changing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let freed = tree_bytes(rank_dir);
        match std::fs::remove_dir_all(rank_dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(err) => return Err(err).with_context(|| format!("cannot remove {}", rank_dir.display())),
        }
        // `remove_dir` removes only an empty folder: another rank's, or a checkpoint archive on its way, stays
        let placement = rank_dir.parent();
        for folder in placement.into_iter().chain(placement.and_then(Path::parent)) {
            if folder.starts_with(&self.root) && folder != self.root && std::fs::remove_dir(folder).is_err() {
                break;
            }
        }
        Ok(freed)
    }

    /// Removes every rank folder: called when the agent starts, before any rank runs here (its
    /// predecessor's ranks died with it). Returns the bytes freed.
    pub fn clear(&self) -> Result<u64> {
        let _changing = self.changing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let freed = tree_bytes(&self.root);
        match std::fs::remove_dir_all(&self.root) {
            Ok(()) => Ok(freed),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(err) => Err(err).with_context(|| format!("cannot clear {}", self.root.display())),
        }
    }
}

/// The bytes of the regular files under `dir` (links not followed; what cannot be read counts 0).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => tree_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank folder with a checkpoint of `bytes` bytes.
    fn make(folders: &RankFolders, (job, attempt, rank): (JobId, i32, i32), bytes: usize) -> PathBuf {
        let dir = folders.rank_folder(job, attempt, rank);
        std::fs::create_dir_all(dir.join("out/checkpoints/epoch-0001")).unwrap();
        std::fs::write(dir.join("out/checkpoints/epoch-0001/model.safetensors"), vec![0u8; bytes]).unwrap();
        dir
    }

    #[test]
    fn an_ended_rank_leaves_nothing_and_its_neighbours_stay() {
        let dir = tempfile::tempdir().unwrap();
        let folders = RankFolders::new(dir.path());
        let job = JobId::new();
        let (dir0, dir1) = (make(&folders, (job, 1, 0), 1000), make(&folders, (job, 1, 1), 10));
        let next = make(&folders, (job, 2, 0), 10);
        assert_eq!(folders.remove(&dir0).unwrap(), 1000);
        assert!(!dir0.exists() && dir1.exists(), "rank 1 of the same placement is untouched");
        assert_eq!(folders.remove(&dir1).unwrap(), 10);
        assert!(!dir1.parent().unwrap().exists(), "the emptied placement folder goes too");
        assert!(next.exists(), "the job's next placement is untouched");
        folders.remove(&next).unwrap();
        assert!(!dir.path().join("jobs").join(job.to_string()).exists(), "the emptied job folder goes too");
        assert!(dir.path().join("jobs").exists(), "the folder of all jobs stays");
        assert_eq!(folders.remove(&next).unwrap(), 0, "removing twice is no error");
    }

    #[test]
    fn a_start_clears_what_an_earlier_agent_left() {
        let dir = tempfile::tempdir().unwrap();
        let folders = RankFolders::new(dir.path());
        make(&folders, (JobId::new(), 3, 1), 500);
        make(&folders, (JobId::new(), 1, 0), 700);
        assert_eq!(folders.clear().unwrap(), 1200);
        assert!(!dir.path().join("jobs").exists());
        assert_eq!(folders.clear().unwrap(), 0);
    }
}
