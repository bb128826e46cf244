// Shared by the build scripts of the crates whose binaries load libtorch (the root package and `worker`).
//
// - Embeds libtorch's folder as an rpath so the built binaries and test executables run without
//   LD_LIBRARY_PATH. `scripts/setup.sh` exports LIBTORCH; torch-sys reads the same variable.
// - Keeps a GPU libtorch's libtorch_cuda.so NEEDED: torch-sys asks for `-ltorch_cuda`, but rustc links with
//   `--as-needed` and no Rust code references a symbol of it, so the linker would drop it, CUDA's hooks
//   would never register, and `tch::Cuda::is_available()` would be false. `rustc-link-arg` applies to this
//   package's final binaries and tests only, never to build scripts (which, linked that way, would fail to
//   start where the loader cannot find the CUDA libraries).
fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(libtorch) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libtorch}/lib");
        if std::path::Path::new(&libtorch).join("lib/libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
