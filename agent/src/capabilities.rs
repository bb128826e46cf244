//! What the ringtrain binary can do on this node, asked of the binary itself (`ringtrain doctor --json`):
//! the agent does not link libtorch, and the ranks it starts do, so their view is the one that counts.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ringtrain_protocol::doctor::DoctorReport;
use ringtrain_protocol::RegisterDevice;
use tokio::process::Command;

/// Runs `exe doctor --json` as a rank would start (without this agent's CUDA_VISIBLE_DEVICES: each rank
/// gets its own).
pub async fn ask(exe: &Path) -> Result<DoctorReport> {
    let run =
        Command::new(exe).args(["doctor", "--json"]).env_remove("CUDA_VISIBLE_DEVICES").kill_on_drop(true).output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .context("`ringtrain doctor` did not answer within 120 s")?
        .with_context(|| format!("cannot run {} doctor", exe.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "`{} doctor` failed ({}): {}",
        exe.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    serde_json::from_slice(&output.stdout).context("cannot read `ringtrain doctor --json`")
}

/// One log line's worth of the report.
pub fn summary(report: &DoctorReport) -> String {
    let gpus: Vec<String> = report.cuda.devices.iter().map(|g| format!("{} ({})", g.name, g.index)).collect();
    format!(
        "libtorch {} ({} build), CUDA {}, {} GPU(s){}, NCCL {}, {} CPU threads",
        report.libtorch.version,
        if report.libtorch.cuda_build { "CUDA" } else { "CPU" },
        if report.cuda.available { "available" } else { "unavailable" },
        report.cuda.device_count,
        if gpus.is_empty() { String::new() } else { format!(": {}", gpus.join(", ")) },
        report.nccl.version.as_deref().unwrap_or("not loadable"),
        report.cpu_threads,
    )
}

/// Refuses to offer GPUs the ranks could not train on; the error says why and how to go on.
pub fn check_offered_gpus(report: Result<&DoctorReport, &anyhow::Error>, offered: &[RegisterDevice]) -> Result<()> {
    let gpus: Vec<u32> = offered.iter().filter(|d| d.kind == "gpu").map(|d| d.index).collect();
    if gpus.is_empty() {
        return Ok(());
    }
    let report = report.map_err(|e| anyhow::anyhow!("cannot check the GPUs to offer: {e:#}"))?;
    report.check_gpus(&gpus).map_err(|why| anyhow::anyhow!("{why}; give --gpus none to offer only CPU slots"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtrain_protocol::doctor::{CudaReport, LibtorchReport, NcclReport};

    fn report(available: bool, device_count: usize) -> DoctorReport {
        DoctorReport {
            ringtrain_version: "0.1.0".into(),
            libtorch: LibtorchReport { version: "2.11.0".into(), cuda_build: available },
            cuda: CudaReport {
                available,
                device_count,
                devices: vec![],
                driver_cuda: None,
                cudnn_version: None,
                visible_devices: None,
                why_not: (!available).then(|| "this binary's libtorch is the CPU build".to_string()),
            },
            nccl: NcclReport { loadable: false, version: None, error: None },
            cpu_threads: 2,
            libtorch_threads: 1,
            datasets: vec![],
        }
    }

    fn gpu(index: u32) -> RegisterDevice {
        RegisterDevice { index, kind: "gpu".into(), name: "NVIDIA H200".into(), memory_bytes: None }
    }

    #[test]
    fn gpus_a_cpu_build_cannot_use_are_refused_with_the_reason() {
        let err = check_offered_gpus(Ok(&report(false, 0)), &[gpu(0)]).unwrap_err().to_string();
        assert!(err.contains("CPU build") && err.contains("--gpus none"), "{err}");
    }

    #[test]
    fn gpus_beyond_what_libtorch_sees_are_named() {
        let err = check_offered_gpus(Ok(&report(true, 1)), &[gpu(0), gpu(1)]).unwrap_err().to_string();
        assert!(err.contains("[1]") && err.contains("sees only 1"), "{err}");
        assert!(check_offered_gpus(Ok(&report(true, 2)), &[gpu(0), gpu(1)]).is_ok());
    }

    #[test]
    fn cpu_slots_need_no_report() {
        let missing = anyhow::anyhow!("no doctor");
        let cpu = RegisterDevice { index: 0, kind: "cpu".into(), name: "cpu slot 0".into(), memory_bytes: None };
        assert!(check_offered_gpus(Err(&missing), &[cpu]).is_ok());
        assert!(check_offered_gpus(Err(&missing), &[gpu(0)]).is_err());
    }
}
