//! `ringtrain doctor`: what this binary and machine can do, gathered from libtorch, the NVIDIA driver and
//! NCCL (see [`DoctorReport`]); and, for a GPU job that lands where CUDA is missing, why it is missing.

use std::path::Path;

use ringtrain_protocol::doctor::{CudaReport, DatasetPresence, DoctorReport, GpuReport, LibtorchReport, NcclReport};

use crate::cuda::driver::{self, cuda_version_text};
use crate::cuda::is_loaded;
use crate::cuda::nccl::{version_text, Nccl};
use crate::data::FASHION_MNIST_DIR;

/// The libtorch version the build script found in $LIBTORCH.
pub const LIBTORCH_VERSION: &str = env!("RINGTRAIN_LIBTORCH_VERSION");

pub fn probe() -> DoctorReport {
    let cuda_build = is_loaded("libtorch_cuda.so");
    let available = tch::Cuda::is_available();
    let device_count = if available { tch::Cuda::device_count().max(0) as usize } else { 0 };
    let driver = driver::probe();
    let visible_devices = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let devices = match &driver {
        Ok(report) => report
            .gpus
            .iter()
            .map(|g| GpuReport { index: g.index, name: g.name.clone(), memory_bytes: g.memory_bytes })
            .collect(),
        Err(_) => Vec::new(),
    };
    let cudnn_version =
        (available && tch::Cuda::cudnn_is_available()).then(tch::utils::version_cudnn).filter(|&v| v > 0);
    let why_not = (!available).then(|| driver::why_no_cuda(cuda_build, &driver, visible_devices.as_deref()));
    let nccl = match Nccl::load() {
        Ok(nccl) => match nccl.version_code() {
            Ok(code) => NcclReport { loadable: true, version: Some(version_text(code)), error: None },
            Err(e) => NcclReport { loadable: true, version: None, error: Some(e.to_string()) },
        },
        Err(e) => NcclReport { loadable: false, version: None, error: Some(e.to_string()) },
    };
    DoctorReport {
        ringtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        libtorch: LibtorchReport { version: LIBTORCH_VERSION.to_string(), cuda_build },
        cuda: CudaReport {
            available,
            device_count,
            devices,
            driver_cuda: driver.as_ref().ok().map(|d| cuda_version_text(d.cuda_version)),
            cudnn_version,
            visible_devices,
            why_not,
        },
        nccl,
        cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        libtorch_threads: tch::get_num_threads(),
        datasets: vec![DatasetPresence {
            name: "fashion-mnist".to_string(),
            path: FASHION_MNIST_DIR.to_string(),
            present: Path::new(FASHION_MNIST_DIR).join("train-images-idx3-ubyte.gz").exists(),
        }],
    }
}

/// Why libtorch sees no CUDA device in this process, in words.
pub fn why_no_cuda() -> String {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    driver::why_no_cuda(is_loaded("libtorch_cuda.so"), &driver::probe(), visible.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_build_reports_no_cuda_and_says_why() {
        let report = probe();
        assert!(!report.libtorch.version.is_empty());
        assert!(report.cpu_threads >= 1);
        // The CI machines build against the CPU libtorch of scripts/setup.sh.
        if !report.libtorch.cuda_build {
            assert!(!report.cuda.available);
            assert!(report.cuda.why_not.as_deref().unwrap_or_default().contains("CPU build"));
            assert!(report.check_gpus(&[0]).unwrap_err().contains("CPU build"));
        }
        assert!(report.check_gpus(&[]).is_ok());
    }
}
