//! What a comparison with PyTorch needs on this side: a Python with torch, and the JSON lines a process
//! prints. Used by `ringtrain-bench pytorch|seeds|data`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Fails unless `python` imports torch, naming the way to get one.
pub fn check_python(python: &Path) -> Result<()> {
    let probe = Command::new(python).args(["-c", "import torch; print(torch.__version__)"]).output();
    match probe {
        Ok(out) if out.status.success() => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            eprintln!("PyTorch {version} ({})", python.display());
            Ok(())
        }
        _ => bail!(
            "{} has no torch: pass --python (scripts/bench/pytorch-venv.sh installs one and prints its path)",
            python.display()
        ),
    }
}

/// Runs a command to its end and returns the JSON objects it printed on stdout, one per line.
pub fn json_lines(command: &mut Command, what: &str) -> Result<Vec<Value>> {
    eprintln!("{what} ...");
    let output = command.output().with_context(|| format!("cannot start {what}"))?;
    if !output.status.success() {
        bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).filter(Value::is_object).collect())
}
