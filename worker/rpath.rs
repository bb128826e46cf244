// Shared by the build scripts of the crates whose binaries load libtorch (the root package and `worker`):
// embed libtorch's folder as an rpath so the built binaries and test executables run without
// LD_LIBRARY_PATH. `scripts/setup.sh` exports LIBTORCH; torch-sys reads the same variable.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(libtorch) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libtorch}/lib");
    }
}
