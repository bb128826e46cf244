//! The NVIDIA driver (libcuda.so.1): which GPUs this process can see, their names and memory, and when
//! there are none, why. Used by `ringtrain doctor` and to explain a missing CUDA; training itself goes
//! through libtorch.

use std::ffi::{c_char, c_int, CStr};

use serde::{Deserialize, Serialize};

use super::library::{function, open, LoadError};

/// A GPU as the driver describes it (index as this process numbers them, after CUDA_VISIBLE_DEVICES).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
}

/// What the driver reports: its CUDA version (e.g. 13000) and the visible GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverReport {
    pub cuda_version: i32,
    pub gpus: Vec<Gpu>,
}

/// Asks the driver. Err: the driver is missing (a machine without NVIDIA's driver) or failed to start (its
/// message, e.g. "no CUDA-capable device is detected").
pub fn probe() -> Result<DriverReport, String> {
    let lib = open("the NVIDIA driver", &["libcuda.so.1", "libcuda.so"]).map_err(|e: LoadError| e.to_string())?;
    let symbol_error = |e: LoadError| e.to_string();
    type Int = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: `function`'s contract: each type is the signature cuda.h declares for that name (CUdevice is an
    // int), and `lib` stays loaded until this function returns, after the last call through them.
    let (init, driver_version, count, get, name, total_mem, error_string) = unsafe {
        (
            function::<unsafe extern "C" fn(u32) -> c_int>(&lib, "libcuda", "cuInit").map_err(symbol_error)?,
            function::<Int>(&lib, "libcuda", "cuDriverGetVersion").map_err(symbol_error)?,
            function::<Int>(&lib, "libcuda", "cuDeviceGetCount").map_err(symbol_error)?,
            function::<unsafe extern "C" fn(*mut c_int, c_int) -> c_int>(&lib, "libcuda", "cuDeviceGet")
                .map_err(symbol_error)?,
            function::<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int>(&lib, "libcuda", "cuDeviceGetName")
                .map_err(symbol_error)?,
            function::<unsafe extern "C" fn(*mut usize, c_int) -> c_int>(&lib, "libcuda", "cuDeviceTotalMem_v2")
                .map_err(symbol_error)?,
            function::<unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int>(&lib, "libcuda", "cuGetErrorString")
                .map_err(symbol_error)?,
        )
    };
    let explain = |op: &str, code: c_int| -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string (or leaves it null for an unknown code).
        unsafe { error_string(code, &mut text) };
        let message = if text.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: static NUL-terminated string.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        format!("the NVIDIA driver's {op} failed: {message} (CUresult {code})")
    };
    // SAFETY: plain driver calls whose out-pointers are to locals that outlive them; `buf` is zeroed and
    // cuDeviceGetName writes at most `buf.len()` bytes, NUL included, so `CStr::from_ptr` finds a NUL inside it.
    unsafe {
        let code = init(0);
        if code != 0 {
            return Err(explain("cuInit", code));
        }
        let mut version = 0;
        driver_version(&mut version);
        let mut n = 0;
        let code = count(&mut n);
        if code != 0 {
            return Err(explain("cuDeviceGetCount", code));
        }
        let mut gpus = Vec::new();
        for index in 0..n {
            let mut device = 0;
            if get(&mut device, index) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 256];
            name(buf.as_mut_ptr(), buf.len() as c_int, device);
            let mut bytes = 0usize;
            total_mem(&mut bytes, device);
            gpus.push(Gpu {
                index: index as usize,
                name: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                memory_bytes: bytes as u64,
            });
        }
        Ok(DriverReport { cuda_version: version, gpus })
    }
}

/// Why libtorch sees no CUDA device, from what is known about this process: whether libtorch's CUDA
/// library is loaded at all, what the driver said, and CUDA_VISIBLE_DEVICES.
pub fn why_no_cuda(torch_cuda_loaded: bool, driver: &Result<DriverReport, String>, visible: Option<&str>) -> String {
    if !torch_cuda_loaded {
        return "this binary's libtorch is the CPU build (libtorch_cuda.so is not loaded): build ringtrain against \
                a CUDA libtorch (RINGTRAIN_GPU=1 scripts/setup.sh)"
            .to_string();
    }
    let hidden = match visible {
        Some(v) => format!(" (CUDA_VISIBLE_DEVICES={v:?} hides the others)"),
        None => String::new(),
    };
    match driver {
        Err(reason) if reason.contains("cannot load") => {
            format!("no NVIDIA driver on this machine: {reason}")
        }
        Err(reason) => format!("{reason}{hidden}"),
        Ok(report) if report.gpus.is_empty() => format!("the NVIDIA driver sees no GPU{hidden}"),
        Ok(report) => format!(
            "the driver sees {} GPU(s) but libtorch cannot use them: is the driver (CUDA {}) older than \
             libtorch's CUDA?{hidden}",
            report.gpus.len(),
            cuda_version_text(report.cuda_version)
        ),
    }
}

/// "13.0" from 13000.
pub fn cuda_version_text(code: i32) -> String {
    format!("{}.{}", code / 1000, code % 1000 / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_libtorch_is_named_as_the_reason_first() {
        let why = why_no_cuda(false, &Err("anything".into()), None);
        assert!(why.contains("CPU build"), "{why}");
    }

    #[test]
    fn a_missing_driver_and_hidden_devices_are_told_apart() {
        let missing = Err("cannot load the NVIDIA driver (tried libcuda.so.1): not found".to_string());
        assert!(why_no_cuda(true, &missing, None).starts_with("no NVIDIA driver"));
        let none = Ok(DriverReport { cuda_version: 13000, gpus: vec![] });
        let why = why_no_cuda(true, &none, Some(""));
        assert!(why.contains("sees no GPU") && why.contains("CUDA_VISIBLE_DEVICES=\"\""), "{why}");
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12080), "12.8");
    }

    #[test]
    fn probing_a_machine_without_a_driver_is_an_error_not_a_crash() {
        // CI machines have no NVIDIA driver; a GPU machine lists its GPUs. Either way no panic.
        match probe() {
            Ok(report) => assert!(report.cuda_version > 0),
            Err(reason) => assert!(reason.contains("driver"), "{reason}"),
        }
    }
}
