//! NCCL's C API, as far as ringtrain uses it: version, unique id, a non-blocking communicator, in-place
//! all-reduce and broadcast of f32 device buffers, asynchronous errors, abort. Types and constants follow
//! `nccl.h` of NCCL 2.28.9 (what torch 2.11.0 ships); the communicator's config struct is
//! `ncclConfig_v22800`, so NCCL older than 2.28 is refused.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};

use libloading::Library;
use tch::{Kind, Tensor};

use super::library::{function, open, LoadError};

/// What `ncclGetVersion` reports for 2.28.0 (NCCL_VERSION(2, 28, 0)): the oldest NCCL with the config layout
/// below.
pub const MIN_VERSION_CODE: i32 = 22800;
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the 128 bytes rank 0 makes and every rank passes to the communicator's creation.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    pub fn to_bytes(self) -> [u8; UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    pub fn from_bytes(bytes: [u8; UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId { internal: bytes.map(|b| b as c_char) }
    }
}

/// `ncclConfig_t` as of NCCL 2.28 (`ncclConfig_v22800`), field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
    traffic_class: c_int,
    comm_name: *const c_char,
    collnet_enable: c_int,
    cta_policy: c_int,
    shrink_share: c_int,
    nvls_ctas: c_int,
    n_channels_per_net_peer: c_int,
    nvlink_centric_sched: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: "let NCCL choose".
const UNDEF_INT: c_int = c_int::MIN;

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: calls return at once (`ncclInProgress`) and the
    /// communicator can be aborted at any point, which is what makes a dead peer an error instead of a hang.
    fn non_blocking() -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: MIN_VERSION_CODE as u32,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
            traffic_class: UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: UNDEF_INT,
            cta_policy: UNDEF_INT,
            shrink_share: UNDEF_INT,
            nvls_ctas: UNDEF_INT,
            n_channels_per_net_peer: UNDEF_INT,
            nvlink_centric_sched: UNDEF_INT,
        }
    }
}

/// `ncclResult_t` values.
const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;
const FLOAT32: c_int = 7; // ncclFloat32
const SUM: c_int = 0; // ncclSum

/// The name `nccl.h` gives a result code, and what it means for the caller.
pub fn result_name(code: c_int) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError (a CUDA call failed inside NCCL)",
        2 => "ncclSystemError (a system or network call failed: a peer may be gone)",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError (a peer reported an error or went away)",
        7 => "ncclInProgress",
        _ => "an unknown NCCL result",
    }
}

/// A failed NCCL call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NCCL {op} failed: {} (code {code}){}", result_name(*.code), detail_suffix(.detail))]
pub struct NcclError {
    pub op: &'static str,
    pub code: c_int,
    /// NCCL's last error message, when it has one.
    pub detail: String,
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

type RawComm = *mut c_void;
type Stream = *mut c_void;

/// The functions of libnccl.so.2 ringtrain calls, resolved once.
struct Functions {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank_config: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(RawComm, *mut c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(RawComm) -> c_int,
    comm_finalize: unsafe extern "C" fn(RawComm) -> c_int,
    comm_destroy: unsafe extern "C" fn(RawComm) -> c_int,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    get_last_error: unsafe extern "C" fn(RawComm) -> *const c_char,
}

/// libnccl.so.2, loaded.
pub struct Nccl {
    f: Functions,
    _lib: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nccl")
    }
}

/// The file names tried, in order: the PyPI wheel's and the SONAME libtorch_cuda.so needs first.
pub const LIBRARY_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

impl Nccl {
    /// Loads NCCL once per process.
    pub fn load() -> Result<Arc<Nccl>, LoadError> {
        static LOADED: OnceLock<Result<Arc<Nccl>, LoadError>> = OnceLock::new();
        LOADED.get_or_init(|| Self::open_library().map(Arc::new)).clone()
    }

    fn open_library() -> Result<Nccl, LoadError> {
        const WHAT: &str = "NCCL";
        let lib = open(WHAT, LIBRARY_NAMES)?;
        // SAFETY: `function`'s contract: each type below is the signature nccl.h (2.28.9) declares for that
        // name, and the pointers live in `Nccl::f` next to `Nccl::_lib`, which keeps the library loaded for as
        // long as they can be called.
        let f = unsafe {
            Functions {
                get_version: function(&lib, WHAT, "ncclGetVersion")?,
                get_unique_id: function(&lib, WHAT, "ncclGetUniqueId")?,
                comm_init_rank_config: function(&lib, WHAT, "ncclCommInitRankConfig")?,
                comm_get_async_error: function(&lib, WHAT, "ncclCommGetAsyncError")?,
                comm_abort: function(&lib, WHAT, "ncclCommAbort")?,
                comm_finalize: function(&lib, WHAT, "ncclCommFinalize")?,
                comm_destroy: function(&lib, WHAT, "ncclCommDestroy")?,
                all_reduce: function(&lib, WHAT, "ncclAllReduce")?,
                broadcast: function(&lib, WHAT, "ncclBroadcast")?,
                group_start: function(&lib, WHAT, "ncclGroupStart")?,
                group_end: function(&lib, WHAT, "ncclGroupEnd")?,
                get_last_error: function(&lib, WHAT, "ncclGetLastError")?,
            }
        };
        Ok(Nccl { f, _lib: lib })
    }

    /// `ncclGetVersion`: e.g. 22809 for 2.28.9.
    pub fn version_code(&self) -> Result<i32, NcclError> {
        let mut version = 0;
        // SAFETY: ncclGetVersion writes one int through the pointer, to a local that outlives the call.
        self.check("version", unsafe { (self.f.get_version)(&mut version) }, std::ptr::null_mut())?;
        Ok(version)
    }

    /// A new unique id (rank 0 only): starts NCCL's bootstrap listener on this host.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId { internal: [0; UNIQUE_ID_BYTES] };
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId through the pointer; `UniqueId` is its 128-byte
        // `#[repr(C)]` layout, and `id` is a local that outlives the call.
        self.check("unique id", unsafe { (self.f.get_unique_id)(&mut id) }, std::ptr::null_mut())?;
        Ok(id)
    }

    /// Starts creating this rank's communicator without blocking: poll [`Comm::state`] until it is ready.
    /// CUDA's current device on this thread is the communicator's (the rank's only visible GPU).
    pub fn start_comm(self: &Arc<Self>, world: usize, id: UniqueId, rank: usize) -> Result<Comm, NcclError> {
        let mut raw: RawComm = std::ptr::null_mut();
        let mut config = Config::non_blocking();
        // SAFETY: NCCL writes the new handle to `raw`, a local; `config` is a valid `ncclConfig_v22800` (its
        // layout is pinned by the test below) that outlives the call, and NCCL copies what it needs of it.
        let code = unsafe { (self.f.comm_init_rank_config)(&mut raw, world as c_int, id, rank as c_int, &mut config) };
        if code != SUCCESS && code != IN_PROGRESS {
            return Err(self.error("init", code, raw));
        }
        Ok(Comm { nccl: Arc::clone(self), raw })
    }

    fn check(&self, op: &'static str, code: c_int, raw: RawComm) -> Result<(), NcclError> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(self.error(op, code, raw))
        }
    }

    fn error(&self, op: &'static str, code: c_int, raw: RawComm) -> NcclError {
        // SAFETY: ncclGetLastError ignores its argument (nccl.h: "comm is currently unused and can be set to
        // NULL"), so a null `raw`, or one whose creation failed, is fine; it returns NCCL's last-error buffer.
        let text = unsafe { (self.f.get_last_error)(raw) };
        let detail = if text.is_null() {
            String::new()
        } else {
            // SAFETY: not null (checked); the buffer is a static NUL-terminated array inside the library,
            // which `self._lib` keeps loaded, and NCCL rewrites it only on a later error. It is copied at once.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().trim().to_string()
        };
        NcclError { op, code, detail }
    }
}

/// "2.28.9" from 22809 (and "2.8.4" from 2804, the scheme before 2.9).
pub fn version_text(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code / 100 % 10, code % 100)
    }
}

/// Where a non-blocking communicator stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommState {
    Ready,
    InProgress,
    Failed(NcclError),
}

/// One rank's non-blocking communicator: a raw handle, with no teardown policy of its own. Only one thread
/// uses it at a time (the trainer's, or the helper thread that aborts it after the trainer gave up on it).
///
/// It has no `Drop`, deliberately. The only way to free a communicator that may be broken is
/// `ncclCommAbort`, which can hang when a peer is gone, and a `drop` cannot be given up on; a clean
/// `ncclCommFinalize` has to be polled to completion first. So the owner decides the teardown:
/// [`NcclCollective`](crate::NcclCollective)'s `Drop` finalizes and destroys a healthy communicator within a
/// bound, and otherwise aborts it on a helper thread it can leave behind. A `Comm` dropped without
/// [`Comm::abort`] or [`Comm::destroy`] leaks the communicator (its NCCL threads, sockets and device memory)
/// without a word, so any new code that holds one must hand it to one of them on every path.
#[derive(Debug)]
pub struct Comm {
    nccl: Arc<Nccl>,
    /// From `ncclCommInitRankConfig` (which succeeded or is in progress), live until `abort` or `destroy`
    /// consumes the `Comm`.
    raw: RawComm,
}

// SAFETY: NCCL allows a communicator to be used from any thread as long as only one thread operates it at a
// time, and a group's calls all come from one thread (NCCL's user guide, "Thread Safety"). Moving a `Comm`
// moves the only handle to it. Non-concurrency is not given by `&mut self`: `state` takes `&self`. It is
// given by `Comm` being `!Sync` (the raw pointer field makes it so, and there is no `unsafe impl Sync`), so
// a `&Comm` never reaches another thread and every call, `&self` or not, runs on the thread that holds the
// `Comm`; `grouped` makes a whole group within one call. The other field, `Arc<Nccl>`, is `Send` and `Sync`
// by itself (function pointers and a `Library`).
unsafe impl Send for Comm {}

impl Comm {
    /// `ncclCommGetAsyncError`: ready, still working (creation, or a non-blocking call), or failed.
    pub fn state(&self, op: &'static str) -> CommState {
        let mut status = SUCCESS;
        // SAFETY: the handle is live (see `raw`); NCCL writes one int to `status`, a local.
        let code = unsafe { (self.nccl.f.comm_get_async_error)(self.raw, &mut status) };
        let status = if code == SUCCESS { status } else { code };
        match status {
            SUCCESS => CommState::Ready,
            IN_PROGRESS => CommState::InProgress,
            failed => CommState::Failed(self.nccl.error(op, failed, self.raw)),
        }
    }

    /// Enqueues in-place sums of `tensors` on the default stream as one NCCL group. They must be contiguous
    /// f32 CUDA tensors (checked). Returns before the GPU is done: wait for an event recorded after it.
    pub fn all_reduce_sum(&mut self, tensors: &[Tensor]) -> Result<(), NcclError> {
        self.grouped("all-reduce", tensors, |f, t, raw| {
            let p = t.data_ptr();
            // SAFETY: `p` is the device address of `t`'s `numel` contiguous f32 (checked by `grouped`), summed
            // in place. The kernel goes to the default stream, the one libtorch's caching allocator orders any
            // reuse of that memory on (tch allocates there), so the memory stays `t`'s until the kernel is done.
            unsafe { (f.all_reduce)(p, p, t.numel(), FLOAT32, SUM, raw, std::ptr::null_mut()) }
        })
    }

    /// As [`Comm::all_reduce_sum`], on `stream` instead of the default stream.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of the rank's GPU, and the caller must keep `tensors`' memory from
    /// reuse until the kernels are done: the caching allocator orders reuse on the default stream only, so
    /// the tensors must stay alive until the default stream has waited for `stream` (an event) and the caller
    /// has seen that event complete.
    pub unsafe fn all_reduce_sum_on(&mut self, tensors: &[Tensor], stream: Stream) -> Result<(), NcclError> {
        self.grouped("all-reduce", tensors, |f, t, raw| {
            let p = t.data_ptr();
            // SAFETY: as in `all_reduce_sum`, with the memory kept alive by the caller (this function's
            // contract) instead of by the default stream's order.
            unsafe { (f.all_reduce)(p, p, t.numel(), FLOAT32, SUM, raw, stream) }
        })
    }

    /// Enqueues in-place broadcasts of `tensors` from `root` on the default stream, as [`Comm::all_reduce_sum`].
    pub fn broadcast(&mut self, tensors: &[Tensor], root: usize) -> Result<(), NcclError> {
        self.grouped("broadcast", tensors, |f, t, raw| {
            let p = t.data_ptr();
            // SAFETY: as in all_reduce_sum.
            unsafe { (f.broadcast)(p, p, t.numel(), FLOAT32, root as c_int, raw, std::ptr::null_mut()) }
        })
    }

    fn grouped(
        &mut self,
        op: &'static str,
        tensors: &[Tensor],
        call: impl Fn(&Functions, &Tensor, RawComm) -> c_int,
    ) -> Result<(), NcclError> {
        for t in tensors {
            if !t.device().is_cuda() || t.kind() != Kind::Float || !t.is_contiguous() {
                let detail = format!("needs contiguous f32 CUDA tensors, got {:?} {:?}", t.kind(), t.device());
                return Err(NcclError { op, code: 4, detail });
            }
        }
        let f = &self.nccl.f;
        // SAFETY: group calls take no arguments; the group is opened and closed within this call, on one thread.
        self.nccl.check(op, unsafe { (f.group_start)() }, self.raw)?;
        for t in tensors {
            let code = call(f, t, self.raw);
            if code != SUCCESS && code != IN_PROGRESS {
                // close the group so NCCL's state stays consistent before the caller aborts
                // SAFETY: as above.
                unsafe { (f.group_end)() };
                return Err(self.nccl.error(op, code, self.raw));
            }
        }
        // SAFETY: as above. With a non-blocking communicator this may return ncclInProgress: the caller
        // polls `state` before anything else touches the communicator.
        let code = unsafe { (f.group_end)() };
        if code != SUCCESS && code != IN_PROGRESS {
            return Err(self.nccl.error(op, code, self.raw));
        }
        Ok(())
    }

    /// `ncclCommAbort`: frees the communicator, stopping whatever it has in flight. May itself hang when a
    /// peer is gone (NVIDIA/nccl#829, #1777): callers run it on a thread they can give up on.
    pub fn abort(self) -> Result<(), NcclError> {
        // SAFETY: the handle is live (see `raw`); `self` is consumed, so it is freed once and never used again.
        let code = unsafe { (self.nccl.f.comm_abort)(self.raw) };
        self.nccl.check("abort", code, std::ptr::null_mut())
    }

    /// `ncclCommFinalize` (flush; polled to completion by the caller via `state`), then `destroy`.
    pub fn finalize(&mut self) -> Result<(), NcclError> {
        // SAFETY: the handle is live (see `raw`); finalize does not free it (`destroy` or `abort` does).
        let code = unsafe { (self.nccl.f.comm_finalize)(self.raw) };
        if code != SUCCESS && code != IN_PROGRESS {
            return Err(self.nccl.error("finalize", code, self.raw));
        }
        Ok(())
    }

    /// `ncclCommDestroy` after a completed `finalize`.
    pub fn destroy(self) -> Result<(), NcclError> {
        // SAFETY: as in `abort`: live, and freed once, since `self` is consumed.
        let code = unsafe { (self.nccl.f.comm_destroy)(self.raw) };
        self.nccl.check("destroy", code, std::ptr::null_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_matches_nccl_config_initializer_of_2_28() {
        let config = Config::non_blocking();
        // sizeof(ncclConfig_t) with nccl.h 2.28.9 on x86-64, measured with gcc
        assert_eq!(std::mem::size_of::<Config>(), 80);
        assert_eq!(config.size, 80);
        assert_eq!(std::mem::offset_of!(Config, comm_name), 48);
        assert_eq!(config.magic, 0xcafebeef);
        assert_eq!(config.version, 22800);
        assert_eq!(config.blocking, 0);
        assert_eq!(config.min_ctas, i32::MIN);
        assert!(config.net_name.is_null() && config.comm_name.is_null());
    }

    #[test]
    fn versions_and_results_read_like_nccl_h() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(2804), "2.8.4");
        assert!(result_name(2).contains("ncclSystemError"));
        assert_eq!(result_name(42), "an unknown NCCL result");
        let err = NcclError { op: "init", code: 5, detail: "Duplicate GPU detected".into() };
        assert_eq!(err.to_string(), "NCCL init failed: ncclInvalidUsage (code 5): Duplicate GPU detected");
    }

    #[test]
    fn unique_ids_round_trip_through_bytes() {
        let bytes: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| (i * 7 + 200) as u8);
        assert_eq!(UniqueId::from_bytes(bytes).to_bytes(), bytes);
    }
}
