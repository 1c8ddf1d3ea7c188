//! Generates the Rust declarations of the C headers (`include/sqdisc.h`, `include/sqdisc_sim.h`, and the
//! test-only `c-tests/support/sqdisc_scripted.h`), so that the fuzz target calls the library exactly as the headers declare it.
use std::env;
use std::path::PathBuf;

fn main() {
    let include = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("..").join("include");
    let support = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("..").join("c-tests").join("support");
    for h in [include.join("sqdisc.h"), include.join("sqdisc_sim.h"), support.join("sqdisc_scripted.h")] {
        println!("cargo:rerun-if-changed={}", h.display());
    }
    let bindings = bindgen::Builder::default()
        .header_contents("fuzz_capi.h", "#include <sqdisc_sim.h>\n#include <sqdisc_scripted.h>\n")
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", support.display()))
        .allowlist_function("sqd_.*")
        .allowlist_type("sqd_.*")
        .allowlist_var("SQD_.*")
        .allowlist_type("ibv_(wr_opcode|send_flags|wc_status|wc_opcode|event_type|access_flags)")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate()
        .expect("bindgen could not read include/*.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("capi.rs");
    bindings.write_to_file(out).expect("cannot write the bindings");
}
