//! Opening a shared library by one of its usual names.

use libloading::Library;

/// Why a library cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// None of its names could be opened; `detail` is the loader's message for the last one.
    #[error("cannot load {what} (tried {}): {detail}", .tried.join(", "))]
    Missing { what: &'static str, tried: Vec<&'static str>, detail: String },
    /// It loaded but lacks a function ringtrain needs (a version too old).
    #[error("{what} has no {symbol} (a version too old?): {detail}")]
    Symbol { what: &'static str, symbol: String, detail: String },
}

/// Opens the first of `names` the dynamic loader finds (LD_LIBRARY_PATH, the binary's rpath, ld.so.cache,
/// or a copy already in the process with that SONAME).
pub(super) fn open(what: &'static str, names: &[&'static str]) -> Result<Library, LoadError> {
    let mut detail = String::new();
    for name in names {
        // SAFETY: the callers (`driver`, `runtime`, `nccl`) pass only file names of NVIDIA's driver, CUDA
        // runtime and NCCL libraries, whose load-time initialisers have no preconditions on the caller.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok(lib),
            Err(err) => detail = err.to_string(),
        }
    }
    Err(LoadError::Missing { what, tried: names.to_vec(), detail })
}

/// Whether a library with this file name is already loaded in the process (it is not loaded if not).
pub fn is_loaded(name: &str) -> bool {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LAZY};
    // glibc's value (<dlfcn.h>); libloading does not export it.
    const RTLD_NOLOAD: std::os::raw::c_int = 0x4;
    // SAFETY: with RTLD_NOLOAD, dlopen never loads a library, so it runs no initialisers: it only returns a
    // handle to one already in the process (or fails), and dropping that handle only undoes its own count.
    unsafe { UnixLibrary::open(Some(name), RTLD_LAZY | RTLD_NOLOAD) }.is_ok()
}

/// Copies the function `symbol` out of `lib` as a plain pointer of type `F`. The caller keeps `lib` alive
/// as long as the pointer is used and names `F` exactly as the C header declares the function.
pub(super) unsafe fn function<F: Copy>(lib: &Library, what: &'static str, symbol: &str) -> Result<F, LoadError> {
    let name = format!("{symbol}\0");
    // SAFETY: the caller promises F is the function's C signature (so reading the symbol as an `F` is sound)
    // and keeps `lib` loaded while the copied pointer is used.
    unsafe { lib.get::<F>(name.as_bytes()) }.map(|f| *f).map_err(|err| LoadError::Symbol {
        what,
        symbol: symbol.to_string(),
        detail: err.to_string(),
    })
}
