//! The CUDA runtime (libcudart), for events on the default stream: "is the GPU past this point yet?"
//! without blocking (so a stuck collective can time out), and device-side timing of what ran between two
//! events. libtorch_cuda.so links libcudart, so this opens the copy already in the process; the runtime
//! works on the thread's current device, which libtorch has made the rank's GPU.

use std::ffi::{c_char, c_float, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libloading::Library;

use super::library::{function, open, LoadError};

const SUCCESS: c_int = 0;
const NOT_READY: c_int = 600; // cudaErrorNotReady
const EVENT_DEFAULT: c_uint = 0;
const EVENT_DISABLE_TIMING: c_uint = 2;

type RawEvent = *mut c_void;
type Stream = *mut c_void;

struct Functions {
    event_create_with_flags: unsafe extern "C" fn(*mut RawEvent, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(RawEvent, Stream) -> c_int,
    event_query: unsafe extern "C" fn(RawEvent) -> c_int,
    event_elapsed_time: unsafe extern "C" fn(*mut c_float, RawEvent, RawEvent) -> c_int,
    event_destroy: unsafe extern "C" fn(RawEvent) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// libcudart, loaded.
pub struct Runtime {
    f: Functions,
    _lib: Library,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaRuntime")
    }
}

/// A failed CUDA runtime call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA {op} failed: {message} (cudaError {code})")]
pub struct CudaError {
    pub op: &'static str,
    pub code: c_int,
    pub message: String,
}

/// CUDA 13 (torch 2.11.0's wheels) first; older majors for other libtorch builds.
pub const LIBRARY_NAMES: &[&str] = &["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

impl Runtime {
    pub fn load() -> Result<Arc<Runtime>, LoadError> {
        static LOADED: OnceLock<Result<Arc<Runtime>, LoadError>> = OnceLock::new();
        LOADED.get_or_init(|| Self::open_library().map(Arc::new)).clone()
    }

    fn open_library() -> Result<Runtime, LoadError> {
        const WHAT: &str = "the CUDA runtime";
        let lib = open(WHAT, LIBRARY_NAMES)?;
        // SAFETY: `function`'s contract: each type is the signature cuda_runtime_api.h declares for that name,
        // and the pointers live in `Runtime::f` next to `Runtime::_lib`, which keeps the library loaded.
        let f = unsafe {
            Functions {
                event_create_with_flags: function(&lib, WHAT, "cudaEventCreateWithFlags")?,
                event_record: function(&lib, WHAT, "cudaEventRecord")?,
                event_query: function(&lib, WHAT, "cudaEventQuery")?,
                event_elapsed_time: function(&lib, WHAT, "cudaEventElapsedTime")?,
                event_destroy: function(&lib, WHAT, "cudaEventDestroy")?,
                get_error_string: function(&lib, WHAT, "cudaGetErrorString")?,
            }
        };
        Ok(Runtime { f, _lib: lib })
    }

    /// Records a new event on the default stream (where tch's kernels and NCCL's go): it completes when
    /// everything enqueued before it has. `timing`: whether it can be used with [`Event::elapsed_since`].
    pub fn record(self: &Arc<Self>, timing: bool) -> Result<Event, CudaError> {
        let mut raw: RawEvent = std::ptr::null_mut();
        let flags = if timing { EVENT_DEFAULT } else { EVENT_DISABLE_TIMING };
        // SAFETY: writes one handle.
        self.check("event create", unsafe { (self.f.event_create_with_flags)(&mut raw, flags) })?;
        let event = Event { runtime: Arc::clone(self), raw };
        // SAFETY: a live event on the legacy default stream (null).
        self.check("event record", unsafe { (self.f.event_record)(raw, std::ptr::null_mut()) })?;
        Ok(event)
    }

    fn check(&self, op: &'static str, code: c_int) -> Result<(), CudaError> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let text = unsafe { (self.f.get_error_string)(code) };
        let message = if text.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: a static NUL-terminated string.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        Err(CudaError { op, code, message })
    }
}

/// A recorded CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    runtime: Arc<Runtime>,
    raw: RawEvent,
}

impl Event {
    /// Whether the GPU has done everything enqueued before this event (never blocks).
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        // SAFETY: a live event.
        match unsafe { (self.runtime.f.event_query)(self.raw) } {
            SUCCESS => Ok(true),
            NOT_READY => Ok(false),
            code => self.runtime.check("event query", code).map(|()| false),
        }
    }

    /// GPU time from `start` to this event; both recorded with timing and both complete.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, CudaError> {
        let mut ms: c_float = 0.0;
        // SAFETY: two live events (each `Event` owns its handle until its drop); writes one float to `ms`, a
        // local.
        let code = unsafe { (self.runtime.f.event_elapsed_time)(&mut ms, start.raw, self.raw) };
        self.runtime.check("event timing", code)?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, never used again; destroying an event still pending is allowed.
        unsafe { (self.runtime.f.event_destroy)(self.raw) };
    }
}
