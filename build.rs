include!("worker/rpath.rs");

fn main() {
    link_libtorch();
}
