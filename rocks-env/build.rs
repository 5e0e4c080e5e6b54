//! Compiles the C++ shim against the headers of the exact RocksDB that
//! `librocksdb-sys` builds, with the flags RocksDB itself is built with.

use std::env;
use std::path::PathBuf;

fn main() {
    // librocksdb-sys (links = "rocksdb") exports its manifest directory; the
    // RocksDB sources and headers it compiles live under it.
    let root = env::var("DEP_ROCKSDB_CARGO_MANIFEST_DIR")
        .expect("librocksdb-sys must export DEP_ROCKSDB_CARGO_MANIFEST_DIR (is it a direct dependency?)");
    let rocksdb = PathBuf::from(root).join("rocksdb");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("cpp/shim.cc")
        .file("cpp/fault.cc")
        .include("cpp")
        .include(rocksdb.join("include"))
        .include(&rocksdb)
        .flag("-std=c++20")
        .define("NDEBUG", Some("1"))
        .define("OS_LINUX", None)
        .define("ROCKSDB_PLATFORM_POSIX", None)
        .define("ROCKSDB_LIB_IO_POSIX", None)
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(true);
    let features = env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if features.split(',').any(|f| f == "sse4.2") {
        build.flag_if_supported("-msse4.2");
    }
    if features.split(',').any(|f| f == "pclmulqdq") {
        build.flag_if_supported("-mpclmul");
    }
    build.compile("rocks_env_shim");

    for f in ["cpp/shim.cc", "cpp/shim.h", "cpp/shim_internal.h", "cpp/fault.cc"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
