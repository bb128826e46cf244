include!("rpath.rs");

fn main() {
    link_libtorch();
    compile_autocast_shim();
    record_libtorch_version();
}

/// `ringtrain doctor` reports the libtorch this binary was built against: `build-version` in a libtorch
/// folder (scripts/setup.sh's CPU layout, libtorch zips), `version.py` in a PyTorch package's folder.
fn record_libtorch_version() {
    let libtorch = std::path::PathBuf::from(std::env::var("LIBTORCH").unwrap_or_default());
    let from_file = std::fs::read_to_string(libtorch.join("build-version")).ok().map(|v| v.trim().to_string());
    let from_python = || {
        let text = std::fs::read_to_string(libtorch.join("version.py")).ok()?;
        let line = text.lines().find(|l| l.starts_with("__version__"))?;
        Some(line.split(['\'', '"']).nth(1)?.to_string())
    };
    let version = from_file.or_else(from_python).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RINGTRAIN_LIBTORCH_VERSION={version}");
}

/// The few lines of C++ behind `precision: bf16` (csrc/autocast.cpp), uploaded TorchScript models
/// (csrc/script_module.cpp) and the overlapped all-reduce's gradient hooks (csrc/grad_hooks.cpp), compiled
/// against libtorch's
/// headers with the flags torch-sys uses for its own C++.
fn compile_autocast_shim() {
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-changed=csrc/script_module.cpp");
    println!("cargo:rerun-if-changed=csrc/grad_hooks.cpp");
    println!("cargo:rerun-if-changed=csrc/guarded.h");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        panic!("LIBTORCH is not set: source the env.sh that scripts/setup.sh prints");
    };
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_string());
    cc::Build::new()
        .cpp(true)
        .file("csrc/autocast.cpp")
        .file("csrc/script_module.cpp")
        .file("csrc/grad_hooks.cpp")
        .include(format!("{libtorch}/include"))
        .include(format!("{libtorch}/include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .compile("ringtrain_autocast");
}
