//! An uploaded TorchScript model (saved with `torch.jit.script`/`trace` and `save` from PyTorch), trained
//! like the built-in ones.
//!
//! Its parameters and buffers are registered in the run's `VarStore` under their PyTorch `state_dict` names,
//! sharing storage with the module, so ringtrain's own optimizer, gradient buckets, checkpoints and per-rank
//! BatchNorm tables (the buffers: variables without gradients) see them exactly as they see a built-in
//! model's. What the built-in models get by naming convention comes from the module itself: a parameter is a
//! BatchNorm parameter when the module that holds it is a BatchNorm (by its TorchScript type name), a bias
//! when it is 1-D and named `bias`.
//!
//! The module is driven through csrc/script_module.cpp, because tch's `CModule` lists no buffers. The unsafe
//! code is the calls into it: every pointer passed is live for the call, every C++ exception is caught on the
//! C side (its `guarded`) and comes back as a malloc'd message that `check` frees, and every tensor it
//! returns is a fresh `new torch::Tensor` handle (tch's `C_tensor`) that the `Tensor` made of it owns and
//! frees. Each block's `SAFETY` comment says which of these it relies on.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::nn;
use tch::{Device, Tensor};

type TensorCallback =
    unsafe extern "C" fn(ctx: *mut c_void, name: *const c_char, owner: *const c_char, buffer: c_int, t: *mut c_void);

extern "C" {
    fn ringtrain_script_load(path: *const c_char, device: c_int, error: *mut *mut c_char) -> *mut c_void;
    fn ringtrain_script_load_bytes(
        bytes: *const c_char,
        length: usize,
        device: c_int,
        error: *mut *mut c_char,
    ) -> *mut c_void;
    fn ringtrain_script_free(module: *mut c_void);
    fn ringtrain_script_free_error(error: *mut c_char);
    fn ringtrain_script_tensors(
        module: *mut c_void,
        ctx: *mut c_void,
        callback: TensorCallback,
        error: *mut *mut c_char,
    ) -> c_int;
    fn ringtrain_script_forward(
        module: *mut c_void,
        inputs: *const *mut c_void,
        count: c_int,
        output: *mut *mut c_void,
        error: *mut *mut c_char,
    ) -> c_int;
    fn ringtrain_script_set_train(module: *mut c_void, on: c_int, error: *mut *mut c_char) -> c_int;
    fn ringtrain_script_save(module: *mut c_void, path: *const c_char, error: *mut *mut c_char) -> c_int;
}

/// A parameter or buffer of a scripted module.
#[derive(Debug)]
pub struct ScriptTensor {
    /// Its `state_dict` name, e.g. `numeric.0.weight`.
    pub name: String,
    /// The TorchScript type of the module holding it, e.g. `__torch__.torch.nn.modules.batchnorm.BatchNorm1d`.
    pub owner: String,
    pub buffer: bool,
    pub tensor: Tensor,
}

/// Whether a module type is one of PyTorch's BatchNorm layers (BatchNorm1d/2d/3d, SyncBatchNorm).
pub fn is_batch_norm_type(owner: &str) -> bool {
    owner.rsplit('.').next().is_some_and(|leaf| leaf.contains("BatchNorm"))
}

/// A loaded TorchScript module.
#[derive(Debug)]
pub struct ScriptModule {
    /// A `torch::jit::Module*`, never null: made by `new` in `ringtrain_script_load`, owned by this value
    /// alone (the C side keeps no copy, and `raw_ptr` only lends it), deleted in `Drop`.
    raw: *mut c_void,
    training: Option<bool>,
}

// SAFETY: a `ScriptModule` is the only owner of its heap `torch::jit::Module` (see `raw`), so moving it to
// another thread moves the only access to the module. The module has no thread affinity: it is a handle to
// refcounted libtorch objects (atomic counts), its methods use the calling thread's thread-local state
// (grad mode, autocast) rather than the creating thread's, and its CUDA tensors live in the process-wide
// primary context. Concurrent calls are not ruled out by `&mut self` (`forward`, `tensors` and `save` take
// `&self`) nor by how callers use it, but by `ScriptModule` being `!Sync` (the raw pointer field makes it so,
// and there is no `unsafe impl Sync`): a `&ScriptModule` never reaches another thread, so every call into the
// module runs on the thread that holds it.
unsafe impl Send for ScriptModule {}

impl Drop for ScriptModule {
    fn drop(&mut self) {
        // SAFETY: `raw` is the non-null `torch::jit::Module*` that `ringtrain_script_load` made with `new` and
        // only this value owns; `ringtrain_script_free` deletes it, once, and nothing uses it after `drop`.
        unsafe { ringtrain_script_free(self.raw) }
    }
}

/// Turns the C side's error message into an error, freeing it.
///
/// # Safety
///
/// `error` must be the `char*` a `ringtrain_script_*` call's `error` out-parameter was left holding: the
/// caller sets it to null before the call, and the C side stores there only a malloc'd message (or null,
/// should malloc fail; its `guarded`). It is freed here, so the caller must not use it again.
pub(crate) unsafe fn check(status: c_int, error: *mut c_char, what: &str) -> Result<()> {
    if status == 0 && error.is_null() {
        return Ok(());
    }
    let message = if error.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: `error` is not null, so (by this function's contract) it is `copy_message`'s malloc'd copy
        // of an exception's text, NUL-terminated by `strcpy` and not freed yet. The `CStr` borrow ends at
        // `into_owned`, before the free below.
        let text = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
        // SAFETY: the same malloc'd pointer, freed once, with the C side's `free` (the allocator that made
        // it); it is not used after.
        unsafe { ringtrain_script_free_error(error) };
        text
    };
    bail!("{what}: {}", summarise(&message))
}

/// What a libtorch error says, in a few lines. An error of the TorchScript interpreter carries the failing
/// source twice with markers; what went wrong is its last line (`RuntimeError: ...`), and where, the last
/// `File "...", line N, in forward` of its traceback.
fn summarise(message: &str) -> String {
    let lines: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if !message.contains("Traceback of TorchScript") {
        return lines.into_iter().take(12).collect::<Vec<_>>().join("\n");
    }
    let what = lines.last().copied().unwrap_or("");
    match lines.iter().rev().find(|l| l.starts_with("File ")) {
        Some(place) => format!("{what} ({place})"),
        None => what.to_string(),
    }
}

impl ScriptModule {
    /// Loads a TorchScript file onto `device`.
    pub fn load(path: &Path, device: Device) -> Result<ScriptModule> {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).context("the model path holds a NUL")?;
        let index = device_index(device);
        let mut error = std::ptr::null_mut();
        // SAFETY: `c_path` is NUL-terminated and outlives the call (the C side copies it into a std::string);
        // `error` is a null local the C side may set to a message; `index` is a plain int (the C side makes a
        // c10::Device of it, and whatever libtorch throws for a bad one is caught there). It returns a new
        // module or null, checked next.
        let raw = unsafe { ringtrain_script_load(c_path.as_ptr(), index, &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(if raw.is_null() { -1 } else { 0 }, error, "not a loadable TorchScript file") }?;
        Ok(ScriptModule { raw, training: None })
    }

    /// Loads a TorchScript module held in memory (a member of a composite model's archive) onto `device`.
    pub fn load_bytes(bytes: &[u8], device: Device) -> Result<ScriptModule> {
        let mut error = std::ptr::null_mut();
        // SAFETY: `bytes` is a live slice of `bytes.len()` bytes for the call (the C side copies them into a
        // std::string before parsing and keeps no pointer); the device index and `error` are as in `load`. It
        // returns a new module or null, checked next.
        let raw = unsafe {
            ringtrain_script_load_bytes(bytes.as_ptr() as *const c_char, bytes.len(), device_index(device), &mut error)
        };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(if raw.is_null() { -1 } else { 0 }, error, "not a loadable TorchScript module") }?;
        Ok(ScriptModule { raw, training: None })
    }

    /// The module for the C side's other functions (live while `self` is).
    pub(crate) fn raw_ptr(&self) -> *mut c_void {
        self.raw
    }

    /// Every parameter and buffer, in the module's order.
    pub fn tensors(&self) -> Result<Vec<ScriptTensor>> {
        /// The C side's `ringtrain_tensor_callback`, called once per tensor.
        ///
        /// # Safety
        ///
        /// `ctx` is a `*mut Vec<ScriptTensor>` that nothing else uses during the call; `name` and `owner` are
        /// NUL-terminated and live for the call; `t` is a `new torch::Tensor` whose ownership passes here.
        unsafe extern "C" fn collect(
            ctx: *mut c_void,
            name: *const c_char,
            owner: *const c_char,
            buffer: c_int,
            t: *mut c_void,
        ) {
            // SAFETY: the contract above, which `ringtrain_script_tensors` keeps: `ctx` is `out` of `tensors`,
            // untouched by it while the C call runs, and this `&mut` ends when the callback returns; the strings
            // are `c_str()`s of std::strings the C side keeps alive until the callback returns; `t` is a heap
            // `torch::Tensor` nothing else owns or frees, so the `Tensor` may own it (tch's `at_free` deletes it).
            unsafe {
                let out = &mut *(ctx as *mut Vec<ScriptTensor>);
                out.push(ScriptTensor {
                    name: CStr::from_ptr(name).to_string_lossy().into_owned(),
                    owner: CStr::from_ptr(owner).to_string_lossy().into_owned(),
                    buffer: buffer != 0,
                    tensor: Tensor::from_ptr(t as *mut _),
                });
            }
        }
        let mut out: Vec<ScriptTensor> = Vec::new();
        let mut error = std::ptr::null_mut();
        // SAFETY: `self.raw` is the live module (`self` is borrowed for the call). `collect` has the type of the
        // C side's `ringtrain_tensor_callback` and keeps its contract with `ctx` = `out`, which outlives the
        // call; the C side calls it only before returning and keeps neither. `error` is as in `load`. Should
        // the C side throw midway, the tensors already pushed stay owned by `out` and are freed with it.
        let status =
            unsafe { ringtrain_script_tensors(self.raw, &mut out as *mut _ as *mut c_void, collect, &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(status, error, "cannot list the model's tensors") }?;
        Ok(out)
    }

    /// `forward(*inputs)`, which must return one tensor.
    pub fn forward(&self, inputs: &[Tensor]) -> Result<Tensor> {
        let pointers: Vec<*mut c_void> = inputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let count = c_int::try_from(pointers.len()).context("too many inputs for the model's forward")?;
        let mut output = std::ptr::null_mut();
        let mut error = std::ptr::null_mut();
        // SAFETY: `self.raw` is the live module. `pointers` holds `count` `torch::Tensor*` (tch's `C_tensor`)
        // owned by `inputs`, which is borrowed across the call; the C side only reads them (each becomes an
        // IValue holding a new reference to the same TensorImpl), never writes through the `*mut` nor keeps or
        // frees them. `output` and `error` are null locals the C side may set.
        let status = unsafe { ringtrain_script_forward(self.raw, pointers.as_ptr(), count, &mut output, &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(status, error, "the model's forward failed") }?;
        // SAFETY: `check` passed, so the C side's body ran to its end, whose last statement stored a fresh
        // `new torch::Tensor` in `output` (not null: `new` throws instead, and a throw would have failed the
        // status). Nothing else owns it, so the `Tensor` takes it over and frees it.
        Ok(unsafe { Tensor::from_ptr(output as *mut _) })
    }

    /// Training (dropout on, BatchNorm on batch statistics) or evaluation mode; a no-op when already there.
    pub fn set_training(&mut self, on: bool) -> Result<()> {
        if self.training == Some(on) {
            return Ok(());
        }
        let mut error = std::ptr::null_mut();
        // SAFETY: `self.raw` is the live module, borrowed mutably for the call; `error` is as in `load`.
        let status = unsafe { ringtrain_script_set_train(self.raw, c_int::from(on), &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(status, error, "cannot switch the model's mode") }?;
        self.training = Some(on);
        Ok(())
    }

    /// Saves the module (with its current weights and buffers) as a TorchScript file `torch.jit.load` reads.
    pub fn save(&self, path: &Path) -> Result<()> {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).context("the path holds a NUL")?;
        let mut error = std::ptr::null_mut();
        // SAFETY: `self.raw` is the live module; `c_path` is NUL-terminated and outlives the call (the C side
        // copies it into a std::string); `error` is as in `load`.
        let status = unsafe { ringtrain_script_save(self.raw, c_path.as_ptr(), &mut error) };
        // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
        unsafe { check(status, error, "cannot save the model") }
    }
}

/// The C side's device number: a CUDA device's index, or -1 for the CPU.
fn device_index(device: Device) -> c_int {
    match device {
        Device::Cuda(i) => i as c_int,
        _ => -1,
    }
}

/// Whether the operator allow-list applies when a model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OperatorCheck {
    #[default]
    Enforced,
    /// Only for tests of the sandbox (`--skip-operator-check`, hidden); the server and agents never skip it.
    Skipped,
}

/// A model refused by the operator allow-list: the job's fault, never retried.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RefusedModel(pub String);

/// A scripted module registered in a VarStore.
#[derive(Debug)]
pub struct Scripted {
    pub module: ScriptModule,
    /// The parameters held by BatchNorm modules (their weight-decay rule is `bn_weight_decay`).
    pub batch_norm_params: HashSet<String>,
    /// Whether any BatchNorm module holds buffers (running statistics).
    pub has_batch_norm: bool,
}

impl Scripted {
    /// Loads `path` onto `root`'s device and registers its parameters (trainable) and buffers (not) in the
    /// VarStore under their `state_dict` names. A module that calls an operator the allow-list refuses
    /// ([`super::operators`]), or has no trainable parameters (nothing would train), is refused.
    pub fn load(path: &Path, root: &nn::Path) -> Result<Scripted> {
        Self::load_with(path, root, OperatorCheck::Enforced)
    }

    /// As [`Scripted::load`], with the operator allow-list skipped when `check` says so (the sandbox's own
    /// tests: they show that a hostile model is confined even where the list would not have refused it).
    pub fn load_with(path: &Path, root: &nn::Path, check: OperatorCheck) -> Result<Scripted> {
        Self::registered(ScriptModule::load(path, root.device())?, root, check)
    }

    /// Checks a loaded module's operators (unless `check` skips it) and registers its tensors under `root`.
    pub fn registered(module: ScriptModule, root: &nn::Path, check: OperatorCheck) -> Result<Scripted> {
        if check == OperatorCheck::Enforced {
            if let Some(refused) = super::operators::check(&module)? {
                return Err(RefusedModel(refused.to_string()).into());
            }
        }
        let tensors = module.tensors()?;
        if !tensors.iter().any(|t| !t.buffer && t.tensor.requires_grad()) {
            bail!("the model has no trainable parameters");
        }
        let mut batch_norm_params = HashSet::new();
        let mut has_batch_norm = false;
        let mut seen = HashSet::new();
        for t in tensors {
            // a module used twice lists its tensors twice; the VarStore must hold each once
            if !seen.insert(t.name.clone()) {
                continue;
            }
            let batch_norm = is_batch_norm_type(&t.owner);
            if batch_norm && t.buffer {
                has_batch_norm = true;
            }
            if batch_norm && !t.buffer {
                batch_norm_params.insert(t.name.clone());
            }
            let trainable = !t.buffer && t.tensor.requires_grad();
            register(root, &t.name, t.tensor, trainable);
        }
        Ok(Scripted { module, batch_norm_params, has_batch_norm })
    }
}

/// Adds `tensor` at the dotted `name` (VarStore paths separate segments with dots, and a single segment may
/// not hold one).
fn register(root: &nn::Path, name: &str, tensor: Tensor, trainable: bool) {
    let mut segments: Vec<&str> = name.split('.').collect();
    let leaf = segments.pop().unwrap_or(name);
    let path = segments.iter().fold(root.clone(), |path, segment| path.sub(*segment));
    let _registered = path.add(leaf, tensor, trainable);
}
