//! The CUDA runtime (libcudart), for events on the default stream: "is the GPU past this point yet?"
//! without blocking (so a stuck collective can time out), and device-side timing of what ran between two
//! events; and for a stream of NCCL's own beside it, ordered with the default stream by events (the
//! all-reduce overlapped with backward). libtorch_cuda.so links libcudart, so this opens the copy already in the process; the runtime
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
const STREAM_NON_BLOCKING: c_uint = 1; // cudaStreamNonBlocking: no implicit order with the legacy default stream

type RawEvent = *mut c_void;
/// A `cudaStream_t`; null is the legacy default stream, tch's.
pub type Stream = *mut c_void;

struct Functions {
    event_create_with_flags: unsafe extern "C" fn(*mut RawEvent, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(RawEvent, Stream) -> c_int,
    event_query: unsafe extern "C" fn(RawEvent) -> c_int,
    event_elapsed_time: unsafe extern "C" fn(*mut c_float, RawEvent, RawEvent) -> c_int,
    event_destroy: unsafe extern "C" fn(RawEvent) -> c_int,
    stream_create_with_flags: unsafe extern "C" fn(*mut Stream, c_uint) -> c_int,
    stream_wait_event: unsafe extern "C" fn(Stream, RawEvent, c_uint) -> c_int,
    stream_destroy: unsafe extern "C" fn(Stream) -> c_int,
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
                stream_create_with_flags: function(&lib, WHAT, "cudaStreamCreateWithFlags")?,
                stream_wait_event: function(&lib, WHAT, "cudaStreamWaitEvent")?,
                stream_destroy: function(&lib, WHAT, "cudaStreamDestroy")?,
                get_error_string: function(&lib, WHAT, "cudaGetErrorString")?,
            }
        };
        Ok(Runtime { f, _lib: lib })
    }

    /// Records a new event on the default stream (where tch's kernels and NCCL's go): it completes when
    /// everything enqueued before it has. `timing`: whether it can be used with [`Event::elapsed_since`].
    pub fn record(self: &Arc<Self>, timing: bool) -> Result<Event, CudaError> {
        self.record_on(std::ptr::null_mut(), timing)
    }

    /// Records a new event on `stream` (null: the default stream, as [`Runtime::record`]).
    fn record_on(self: &Arc<Self>, stream: Stream, timing: bool) -> Result<Event, CudaError> {
        let mut raw: RawEvent = std::ptr::null_mut();
        let flags = if timing { EVENT_DEFAULT } else { EVENT_DISABLE_TIMING };
        // SAFETY: writes one handle.
        self.check("event create", unsafe { (self.f.event_create_with_flags)(&mut raw, flags) })?;
        let event = Event { runtime: Arc::clone(self), raw };
        // SAFETY: a live event, on the legacy default stream (null) or a live stream of a `SideStream`.
        self.check("event record", unsafe { (self.f.event_record)(raw, stream) })?;
        Ok(event)
    }

    /// A new stream of its own, ordered with the default stream only through
    /// [`SideStream::after_default`] and [`SideStream::before_default`].
    pub fn side_stream(self: &Arc<Self>) -> Result<SideStream, CudaError> {
        let mut raw: Stream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check("stream create", unsafe { (self.f.stream_create_with_flags)(&mut raw, STREAM_NON_BLOCKING) })?;
        Ok(SideStream { runtime: Arc::clone(self), raw })
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

/// A CUDA stream beside the default one (created non-blocking: the legacy default stream does not wait for
/// it, nor it for the default stream, except through the events below), destroyed on drop.
#[derive(Debug)]
pub struct SideStream {
    runtime: Arc<Runtime>,
    raw: Stream,
}

// SAFETY: a stream handle may be used from any host thread (CUDA streams are not bound to one); the owner
// moves it with the collective that holds it.
unsafe impl Send for SideStream {}

impl SideStream {
    /// The handle, for NCCL calls that enqueue on it.
    pub fn raw(&self) -> Stream {
        self.raw
    }

    /// Work enqueued on this stream from now on waits for everything enqueued on the default stream so far.
    pub fn after_default(&self) -> Result<(), CudaError> {
        let mark = self.runtime.record(false)?;
        // SAFETY: a live stream and a live, recorded event; the wait is enqueued now (dropping the event after
        // is allowed: CUDA releases it once the device is past it).
        let code = unsafe { (self.runtime.f.stream_wait_event)(self.raw, mark.raw, 0) };
        self.runtime.check("stream wait", code)
    }

    /// Records an event after everything enqueued on this stream so far and makes the default stream wait
    /// for it; returns the event (poll it to know when this stream's work is done).
    pub fn before_default(&self) -> Result<Event, CudaError> {
        let done = self.runtime.record_on(self.raw, false)?;
        // SAFETY: the legacy default stream (null) and a live, recorded event.
        let code = unsafe { (self.runtime.f.stream_wait_event)(std::ptr::null_mut(), done.raw, 0) };
        self.runtime.check("stream wait", code)?;
        Ok(done)
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: a live stream, never used again; CUDA lets work still queued on it finish first.
        unsafe { (self.runtime.f.stream_destroy)(self.raw) };
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, never used again; destroying an event still pending is allowed.
        unsafe { (self.runtime.f.event_destroy)(self.raw) };
    }
}
