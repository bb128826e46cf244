//! The environment a confined process starts with: an allow-list of what the loader, libtorch, CUDA, NCCL
//! and logging read. Nothing else passes: not the agent's token, not `DATABASE_URL`, not a bootstrap token,
//! not whatever an operator's shell exported.

const ALLOWED: &[&str] = &[
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "LD_LIBRARY_PATH",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RINGTRAIN_LOG_FORMAT",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
];
const ALLOWED_PREFIXES: &[&str] = &["CUDA_", "NCCL_", "TORCH_", "NVIDIA_"];

/// The allow-listed part of `vars`. `HOME`, `TMPDIR` and `USER` are not inherited: the launcher points
/// the first two at the process's private folder.
pub fn allowed_environment(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.filter(|(name, _)| ALLOWED.contains(&name.as_str()) || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::allowed_environment;

    #[test]
    fn only_what_libtorch_and_the_loader_need_passes() {
        let vars = [
            ("RINGTRAIN_AGENT_TOKEN", "rt_secret"),
            ("DATABASE_URL", "postgres://u:p@db/x"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("HOME", "/root"),
            ("LD_LIBRARY_PATH", "/opt/torch/lib"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("PATH", "/usr/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let kept: Vec<String> = allowed_environment(vars.into_iter()).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kept, ["LD_LIBRARY_PATH", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "PATH"]);
    }
}
