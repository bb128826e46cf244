//! The unprivileged account tenant code runs as where the agent or the server runs as root: never the
//! parent's own user, so that a confined process cannot read the parent's files (the agent token, the
//! database) even where a path to them is reachable.

use std::path::Path;

/// The default account, made by `scripts/setup.sh` (`useradd --system ringtrain-rank`).
pub const DEFAULT_RANK_USER: &str = "ringtrain-rank";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl RankUser {
    /// Looks the account up in /etc/passwd (its primary group is its gid there).
    pub fn lookup(name: &str) -> Result<RankUser, String> {
        Self::lookup_in(Path::new("/etc/passwd"), name)
    }

    fn lookup_in(passwd: &Path, name: &str) -> Result<RankUser, String> {
        let text = std::fs::read_to_string(passwd).map_err(|e| format!("cannot read {}: {e}", passwd.display()))?;
        let found = text.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 4 && fields[0] == name).then(|| (fields[2].parse::<u32>(), fields[3].parse::<u32>()))
        });
        match found {
            Some((Ok(0), _)) | Some((_, Ok(0))) => {
                Err(format!("user {name} is root: tenant code needs an unprivileged account"))
            }
            Some((Ok(uid), Ok(gid))) => Ok(RankUser { name: name.to_string(), uid, gid }),
            Some(_) => Err(format!("user {name} has a malformed line in {}", passwd.display())),
            None => Err(format!(
                "there is no user {name}: create it (scripts/setup.sh does: useradd --system --no-create-home \
                 --shell /usr/sbin/nologin {name}) or name another with --rank-user"
            )),
        }
    }

    /// The account tenant code started by this process runs as: `name` (default [`DEFAULT_RANK_USER`])
    /// where the process is root; none elsewhere (it runs as the process's own user, and naming one is an
    /// error: only root can switch users).
    pub fn for_tenant_code(root: bool, name: Option<&str>) -> Result<Option<RankUser>, String> {
        match (root, name) {
            (true, name) => Self::lookup(name.unwrap_or(DEFAULT_RANK_USER)).map(Some),
            (false, Some(name)) => Err(format!("--rank-user {name}: only a process running as root can switch users")),
            (false, None) => Ok(None),
        }
    }

    /// Gives `path` to this user (the folder a confined process writes).
    pub fn own(&self, path: &Path) -> std::io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }
}

#[cfg(test)]
mod tests {
    use super::RankUser;

    #[test]
    fn accounts_are_read_from_passwd_and_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nringtrain-rank:x:998:997::/nonexistent:/usr/sbin/nologin\n",
        )
        .unwrap();
        let user = RankUser::lookup_in(&passwd, "ringtrain-rank").unwrap();
        assert_eq!((user.uid, user.gid), (998, 997));
        assert!(RankUser::lookup_in(&passwd, "root").unwrap_err().contains("unprivileged"));
        assert!(RankUser::lookup_in(&passwd, "nobody-here").unwrap_err().contains("useradd"));
    }
}
