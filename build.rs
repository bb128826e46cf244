include!("worker/rpath.rs");
