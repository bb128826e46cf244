//! What a ringtrain binary and its machine can do (`ringtrain doctor --json`): written by the rank binary,
//! which links libtorch, and read by the node agent, which does not, before it offers GPUs.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub ringtrain_version: String,
    pub libtorch: LibtorchReport,
    pub cuda: CudaReport,
    pub nccl: NcclReport,
    /// Hardware threads of this machine, and the intra-op threads libtorch uses.
    pub cpu_threads: usize,
    pub libtorch_threads: i32,
    pub datasets: Vec<DatasetPresence>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibtorchReport {
    /// The version this binary was built against (e.g. "2.11.0" or "2.11.0+cu130").
    pub version: String,
    /// Whether libtorch's CUDA library is loaded (a GPU build).
    pub cuda_build: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaReport {
    /// Whether libtorch can train on a GPU here.
    pub available: bool,
    /// Devices libtorch sees (after CUDA_VISIBLE_DEVICES).
    pub device_count: usize,
    pub devices: Vec<GpuReport>,
    /// The CUDA version the driver supports, e.g. "13.0"; absent without a driver.
    pub driver_cuda: Option<String>,
    pub cudnn_version: Option<i64>,
    pub visible_devices: Option<String>,
    /// Why CUDA is not available, in words (absent when it is).
    pub why_not: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclReport {
    pub loadable: bool,
    /// e.g. "2.28.9".
    pub version: Option<String>,
    /// Why it cannot be used, when it cannot.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetPresence {
    pub name: String,
    pub path: String,
    pub present: bool,
}

impl DoctorReport {
    /// Which of `wanted` GPU indices (None: all the agent found) libtorch cannot use, with the reason; Ok
    /// when every one is usable.
    pub fn check_gpus(&self, wanted: &[u32]) -> Result<(), String> {
        if wanted.is_empty() {
            return Ok(());
        }
        if !self.cuda.available {
            let why = self.cuda.why_not.as_deref().unwrap_or("libtorch sees no CUDA device");
            return Err(format!("GPUs {wanted:?} were asked for, but this ringtrain cannot train on them: {why}"));
        }
        let unseen: Vec<u32> = wanted.iter().copied().filter(|&i| i as usize >= self.cuda.device_count).collect();
        if unseen.is_empty() {
            Ok(())
        } else {
            let visible = self
                .cuda
                .visible_devices
                .as_deref()
                .map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"));
            Err(format!(
                "GPUs {unseen:?} were asked for, but libtorch sees only {} device(s){visible}",
                self.cuda.device_count
            ))
        }
    }
}
