//! Which gradient buckets backward has finished, told as it goes (csrc/grad_hooks.cpp: a post hook on each
//! parameter's AccumulateGrad node, as PyTorch DDP's reducer registers). A bucket is ready when the hooks of
//! all its parameters have run; its index then goes down the channel the step armed the hooks with.
#![allow(unsafe_code)] // the hooks are C++; their callback comes back into Rust

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, PoisonError};

use anyhow::{Context, Result};
use tch::Tensor;

use crate::models::scripted::check;

type ReadyCallback = unsafe extern "C" fn(ctx: *mut c_void, index: usize);

extern "C" {
    fn ringtrain_grad_hooks_add(
        params: *const *mut c_void,
        count: usize,
        callback: ReadyCallback,
        ctx: *mut c_void,
        error: *mut *mut c_char,
    ) -> *mut c_void;
    fn ringtrain_grad_hooks_remove(handle: *mut c_void);
}

/// What a hook tells the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Every gradient of this bucket is in its parameters' `.grad`.
    BucketReady(usize),
    /// Backward has returned (sent by the thread that ran it, not by a hook).
    BackwardDone,
}

/// The hooks' shared state: which bucket each parameter is in and how many of each bucket's parameters are
/// still to come in this backward.
#[derive(Debug)]
struct Readiness {
    bucket_of: Vec<usize>,
    sizes: Vec<usize>,
    pending: Vec<AtomicUsize>,
    /// Some while a step waits for buckets; hooks that run otherwise (an earlier micro-batch's backward)
    /// tell nobody.
    armed: Mutex<Option<Sender<Progress>>>,
}

impl Readiness {
    fn param_ready(&self, index: usize) {
        let armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let (Some(progress), Some(&bucket)) = (armed.as_ref(), self.bucket_of.get(index)) else {
            return;
        };
        let before = self.pending[bucket].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if before == Ok(1) {
            // the step may have given up (a failed all-reduce) and dropped its receiver: nobody to tell
            let _ = progress.send(Progress::BucketReady(bucket));
        }
    }
}

/// The hooks on one model's parameters; removed when dropped.
#[derive(Debug)]
pub(crate) struct GradHooks {
    handle: *mut c_void,
    /// The hooks' context: boxed, so its address stays put for as long as the hooks live (they are removed
    /// in `drop`, before this is freed).
    readiness: Box<Readiness>,
}

// SAFETY: the handle is only passed back to `ringtrain_grad_hooks_remove`, once, by whoever drops this; the
// C++ hooks it names keep their own references to the AccumulateGrad nodes, which libtorch lets any thread
// hold. `Readiness` is Sync (atomics and a mutex).
unsafe impl Send for GradHooks {}

impl GradHooks {
    /// Hooks `params` (leaf tensors that require grad); `bucket_of[i]` is parameter i's bucket.
    pub(crate) fn add(params: &[&Tensor], bucket_of: Vec<usize>) -> Result<GradHooks> {
        let buckets = bucket_of.iter().max().map_or(0, |b| b + 1);
        let mut sizes = vec![0; buckets];
        bucket_of.iter().for_each(|&b| sizes[b] += 1);
        let pending = sizes.iter().map(|&n| AtomicUsize::new(n)).collect();
        let readiness = Box::new(Readiness { bucket_of, sizes, pending, armed: Mutex::new(None) });
        let pointers: Vec<*mut c_void> = params.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let ctx = &*readiness as *const Readiness as *mut c_void;
        let mut error = std::ptr::null_mut();
        // SAFETY: `pointers` holds `params.len()` tch tensors (`at::Tensor*`), borrowed across the call and
        // only read (each hook keeps its own reference to the parameter's AccumulateGrad node, not the
        // pointer). `ctx` points into the box this `GradHooks` owns, which outlives the hooks (see `drop`);
        // `on_param_ready` only reads it through a shared reference. `error` is a null local the C side may set.
        let handle =
            unsafe { ringtrain_grad_hooks_add(pointers.as_ptr(), pointers.len(), on_param_ready, ctx, &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(if handle.is_null() { -1 } else { 0 }, error, "cannot hook the parameters' gradients") }
            .context("the overlapped all-reduce")?;
        Ok(GradHooks { handle, readiness })
    }

    /// From now until [`GradHooks::disarm`], each bucket whose gradients are all accumulated is told to
    /// `progress`, once. Every bucket starts this backward with all of its parameters to come.
    pub(crate) fn arm(&self, progress: Sender<Progress>) {
        let r = &self.readiness;
        r.pending.iter().zip(&r.sizes).for_each(|(pending, &n)| pending.store(n, Ordering::Release));
        *r.armed.lock().unwrap_or_else(PoisonError::into_inner) = Some(progress);
    }

    pub(crate) fn disarm(&self) {
        *self.readiness.armed.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Drop for GradHooks {
    fn drop(&mut self) {
        // SAFETY: `handle` came from a successful `ringtrain_grad_hooks_add` and is removed once, here; after
        // this no hook can call back into `readiness`, which is freed only after this body.
        unsafe { ringtrain_grad_hooks_remove(self.handle) };
    }
}

/// The C++ hooks' callback.
unsafe extern "C" fn on_param_ready(ctx: *mut c_void, index: usize) {
    // SAFETY: `ctx` is the `Readiness` of a live `GradHooks` (hooks are removed before it is freed), only
    // ever shared. A panic must not unwind into C++: `param_ready` has none to raise (no unwrap, no
    // indexing out of its own vectors' lengths).
    let readiness = unsafe { &*(ctx as *const Readiness) };
    readiness.param_ready(index);
}
