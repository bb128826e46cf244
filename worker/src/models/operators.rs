//! The operator allow-list for uploaded TorchScript: every operator any code of the module can run (its
//! forward, its `__setstate__`, every helper they call, in every submodule and class) must be of the
//! `aten` or `prim` namespace and not one that touches files, threads or other processes. Checked inside
//! the sandbox at upload (`ringtrain models check`) and again by every rank before it trains.
//!
//! Defence in depth, not the boundary: the sandbox ([`ringtrain_sandbox`]) is what stops a file from being
//! read or written. The list refuses what no model needs to train, so that a hostile model is refused with
//! a clear reason at upload instead of failing (confined) in some rank later.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};

use super::scripted::ScriptModule;

type OperatorCallback = unsafe extern "C" fn(ctx: *mut c_void, kind: *const c_char, function: *const c_char);

extern "C" {
    fn ringtrain_script_operators(
        module: *mut c_void,
        ctx: *mut c_void,
        callback: OperatorCallback,
        error: *mut *mut c_char,
    ) -> c_int;
    fn ringtrain_registered_operators(ctx: *mut c_void, callback: OperatorCallback);
}

/// The namespaces a model's operators may come from: tensor operations and the interpreter's own.
const ALLOWED_NAMESPACES: &[&str] = &["aten", "prim"];

/// Operators of those namespaces that no training step needs, with what they would do.
const DENIED: &[(&str, &str)] = &[
    ("aten::from_file", "maps a file of the host into a tensor (and with shared=True writes it)"),
    ("aten::save", "writes a file of the host"),
    ("aten::_save_parameters", "writes a file of the host"),
    ("aten::_save_for_mobile", "writes a file of the host"),
    ("aten::_load_for_mobile", "reads a file of the host"),
    ("aten::load", "reads a file of the host"),
    ("prim::fork", "runs code on another thread pool, beyond the rank's threads"),
    ("aten::wait", "waits on forked code"),
    ("prim::awaitable", "runs code later, outside the training step"),
    ("prim::awaitable_nowait", "runs code later, outside the training step"),
    ("prim::awaitable_wait", "runs code later, outside the training step"),
    ("prim::rpc_async", "calls another process"),
    ("prim::rpc_sync", "calls another process"),
    ("prim::rpc_remote", "calls another process"),
];

/// An operator the allow-list refuses, and where the model uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedOperator {
    pub operator: String,
    /// The TorchScript function that calls it, e.g. `__torch__.Net.forward`.
    pub function: String,
    pub why: String,
}

impl std::fmt::Display for RefusedOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the model calls {} in {}: not allowed ({})", self.operator, self.function, self.why)
    }
}

/// Why `operator` (a qualified node kind such as `aten::add`) is refused, if it is.
pub fn refusal(operator: &str) -> Option<String> {
    let Some((namespace, _)) = operator.split_once("::") else {
        return Some("not a qualified operator".into());
    };
    if !ALLOWED_NAMESPACES.contains(&namespace) {
        return Some(format!("operators of the {namespace} namespace are not allowed, only aten and prim"));
    }
    DENIED.iter().find(|(denied, _)| *denied == operator).map(|(_, why)| why.to_string())
}

/// Every (operator, function) pair of the module's code.
pub fn used_operators(module: &ScriptModule) -> anyhow::Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut error = std::ptr::null_mut();
    // SAFETY: the module pointer is live for the call; the callback only reads the two C strings, valid for
    // its duration, and pushes owned copies into `out`, which outlives the call.
    let status = unsafe {
        ringtrain_script_operators(module.raw_ptr(), &mut out as *mut _ as *mut c_void, collect_pair, &mut error)
    };
    // SAFETY: `error` is the out-parameter of the call just made, untouched since (`check`'s contract).
    unsafe { super::scripted::check(status, error, "cannot list the model's operators") }?;
    Ok(out)
}

/// The first refused operator of the module, if any (in a stable order: by operator, then function).
pub fn check(module: &ScriptModule) -> anyhow::Result<Option<RefusedOperator>> {
    let mut used = used_operators(module)?;
    used.sort();
    Ok(used
        .into_iter()
        .find_map(|(operator, function)| refusal(&operator).map(|why| RefusedOperator { operator, function, why })))
}

/// Every operator this libtorch registers, with its schema.
pub fn registered_operators() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    // SAFETY: as in `used_operators`; the call cannot fail.
    unsafe { ringtrain_registered_operators(&mut out as *mut _ as *mut c_void, collect_pair) };
    out
}

unsafe extern "C" fn collect_pair(ctx: *mut c_void, first: *const c_char, second: *const c_char) {
    // SAFETY: ctx is the `Vec` the caller passed; both strings are NUL-terminated and live for this call.
    let out = unsafe { &mut *(ctx as *mut Vec<(String, String)>) };
    // SAFETY: both are `c_str()`s of std::strings the C side keeps alive until this call returns.
    let (first, second) = unsafe { (CStr::from_ptr(first), CStr::from_ptr(second)) };
    out.push((first.to_string_lossy().into_owned(), second.to_string_lossy().into_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_thread_and_foreign_operators_are_refused_and_tensor_operators_are_not() {
        for allowed in
            ["aten::linear", "aten::relu", "prim::CallMethod", "prim::If", "prim::RaiseException", "aten::batch_norm"]
        {
            assert_eq!(refusal(allowed), None, "{allowed}");
        }
        for refused in [
            "aten::from_file",
            "aten::save",
            "prim::fork",
            "aten::wait",
            "quantized::linear",
            "profiler::_record_function_enter",
        ] {
            assert!(refusal(refused).is_some(), "{refused}");
        }
    }

    /// A new libtorch that registers another operator taking a file name must not let it through unseen:
    /// every registered aten/prim operator with an argument that names a file is on the denied list.
    #[test]
    fn every_registered_operator_that_takes_a_file_name_is_denied() {
        let registered = registered_operators();
        assert!(registered.len() > 1000, "{} operators registered", registered.len());
        let file_arguments = ["str filename", "str file", "str path", "str f,", "str f)", "str dir"];
        let takes_a_file: Vec<&(String, String)> = registered
            .iter()
            .filter(|(name, _)| name.starts_with("aten::") || name.starts_with("prim::"))
            .filter(|(_, schema)| file_arguments.iter().any(|a| schema.contains(a)))
            .collect();
        assert!(takes_a_file.iter().any(|(name, _)| name == "aten::from_file"), "the test sees from_file");
        for (name, schema) in takes_a_file {
            assert!(refusal(name).is_some(), "{schema} takes a file name and is not denied");
        }
    }
}
