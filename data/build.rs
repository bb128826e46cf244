//! Builds the C shims that decode a crop of a JPEG (csrc/jpeg_region.c, with csrc/jpeg_huffman.c's decoder
//! for restart intervals) and rewrite one with restart markers (csrc/jpeg_restart.c) with libjpeg-turbo, and links libjpeg-turbo statically (Debian's libjpeg62-turbo-dev, which scripts/setup.sh installs): nothing to
//! install on a worker, nothing more to carry to a GPU machine.

fn main() {
    println!("cargo:rerun-if-changed=csrc/jpeg_region.c");
    println!("cargo:rerun-if-changed=csrc/jpeg_region.h");
    println!("cargo:rerun-if-changed=csrc/jpeg_restart.c");
    println!("cargo:rerun-if-changed=csrc/jpeg_huffman.c");
    println!("cargo:rerun-if-changed=csrc/jpeg_huffman.h");
    println!("cargo:rerun-if-env-changed=RINGTRAIN_LIBJPEG_DIR");
    cc::Build::new()
        .files(["csrc/jpeg_region.c", "csrc/jpeg_restart.c", "csrc/jpeg_huffman.c"])
        .opt_level(3)
        .warnings(true)
        .compile("ringtrain_jpeg_region");
    let folder = std::env::var("RINGTRAIN_LIBJPEG_DIR").ok().or_else(|| {
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
            .into_iter()
            .find(|dir| std::path::Path::new(dir).join("libjpeg.a").exists())
            .map(str::to_string)
    });
    match folder {
        Some(folder) => {
            println!("cargo:rustc-link-search=native={folder}");
            println!("cargo:rustc-link-lib=static=jpeg");
        }
        None => panic!(
            "libjpeg.a (libjpeg-turbo) not found: install libjpeg62-turbo-dev (scripts/setup.sh does), or set \
             RINGTRAIN_LIBJPEG_DIR to the folder holding it"
        ),
    }
}
