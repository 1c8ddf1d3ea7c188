//! Link settings for the C shared library: the soname and the export list.
//!
//! Only `sqd_*` symbols leave `libsqdisc.so`; everything Rust's standard library would otherwise export stays
//! local, so two Rust-built libraries in one C program cannot clash.
use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let script = manifest.join("src").join("capi").join("sqdisc.map");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsqdisc.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
}
