include!("rpath.rs");
