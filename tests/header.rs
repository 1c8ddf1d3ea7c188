//! The committed C headers are exactly what cbindgen makes of the current sources.
//!
//! `include/sqdisc.h` holds every `sqd_*` function, type and `SQD_*` constant of this crate; from the crate of
//! the test devices (`sim/`, sqdisc-sim), `include/sqdisc_sim.h` (libsqdisc_sim's) only `sqd_sim_*` /
//! `SQD_SIM_*` and `c-tests/support/sqdisc_scripted.h` (the test-only libsqdisc_scripted's, never installed) only
//! `sqd_scripted_*` / `SQD_SCRIPTED_*`; both include `<sqdisc.h>`. Configuration: `cbindgen.toml`. With `SQDISC_UPDATE_HEADERS=1` (what `make header` sets) the
//! test rewrites the files instead of comparing.

use std::fs;
use std::path::PathBuf;

use cbindgen::bindgen::ir::Item;
use cbindgen::{Bindings, Builder, Config};

const MAIN_HEADER: &str = "include/sqdisc.h";
const SCRIPTED_HEADER: &str = "c-tests/support/sqdisc_scripted.h";
const SIM_HEADER: &str = "include/sqdisc_sim.h";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn config() -> Config {
    let path = root().join("cbindgen.toml");
    let mut config = Config::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (major, minor, patch) = (
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    );
    // The version macros come from Cargo.toml, the single place the version is written.
    config.after_includes = Some(format!(
        "\n/** The version of the headers: compare with sqd_version() for the library actually loaded. */\n\
         #define SQD_VERSION \"{}\"\n\
         #define SQD_VERSION_MAJOR {major}\n\
         #define SQD_VERSION_MINOR {minor}\n\
         #define SQD_VERSION_PATCH {patch}",
        env!("CARGO_PKG_VERSION")
    ));
    config
}

/// The crate of the software HCA and the scripted device.
fn sim_root() -> PathBuf {
    root().join("sim")
}

fn generate(config: Config) -> Bindings {
    generate_from(root(), config)
}

fn generate_from(krate: PathBuf, config: Config) -> Bindings {
    Builder::new()
        .with_config(config)
        .with_crate(krate)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not read the crate: {e}"))
}

/// Whether a C name belongs to the scripted test device's header.
fn is_scripted(c_name: &str) -> bool {
    c_name.starts_with("sqd_scripted") || c_name.starts_with("SQD_SCRIPTED")
}

/// Whether a C name belongs to the software HCA's header.
fn is_sim(c_name: &str) -> bool {
    c_name.starts_with("sqd_sim") || c_name.starts_with("SQD_SIM")
}

/// The C name of an item, without the `struct ` that verbs renames carry.
fn c_name(item: &dyn Item) -> &str {
    item.export_name().trim_start_matches("struct ")
}

/// Every name the C API puts into a user's namespace must carry the library's prefix.
fn check_namespace(bindings: &Bindings) {
    let mut bad = Vec::new();
    for f in &bindings.functions {
        if !f.path().name().starts_with("sqd_") {
            bad.push(format!("function {}", f.path().name()));
        }
    }
    for item in &bindings.items {
        let name = c_name(item.deref());
        if !(name.starts_with("sqd_") || name.starts_with("SQD_")) {
            bad.push(format!("type {name} (Rust `{}`)", item.deref().path().name()));
        }
    }
    assert!(
        bad.is_empty(),
        "C API names without the sqd_ prefix: {}.\nGive the Rust type a C name in cbindgen.toml [export.rename], \
         then run `make header`.",
        bad.join(", ")
    );
}

/// Keeps only what `keep` accepts (by C name); constants are limited to `SQD_*` in any case.
fn select(mut bindings: Bindings, keep: impl Fn(&str) -> bool) -> Bindings {
    bindings.functions.retain(|f| keep(f.path().name()));
    bindings.items.retain(|i| keep(c_name(i.deref())));
    bindings.constants.retain(|c| c.export_name().starts_with("SQD_") && keep(c.export_name()));
    bindings.globals.retain(|g| keep(g.export_name()));
    bindings
}

fn render(bindings: &Bindings) -> String {
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote UTF-8")
}

fn headers() -> Vec<(&'static str, String)> {
    let all = generate(config());
    check_namespace(&all);
    let main = select(all, |name| !is_scripted(name) && !is_sim(name));

    let mut scripted_config = config();
    scripted_config.include_guard = Some("SQDISC_SCRIPTED_H".to_string());
    scripted_config.sys_includes = vec!["sqdisc.h".to_string()];
    scripted_config.after_includes = None;
    let devices = generate_from(sim_root(), scripted_config);
    check_namespace(&devices);
    let scripted = select(devices, is_scripted);

    let mut sim_config = config();
    sim_config.include_guard = Some("SQDISC_SIM_H".to_string());
    sim_config.sys_includes = vec!["sqdisc.h".to_string()];
    sim_config.after_includes = None;
    let sim = select(generate_from(sim_root(), sim_config), is_sim);

    vec![(MAIN_HEADER, render(&main)), (SCRIPTED_HEADER, render(&scripted)), (SIM_HEADER, render(&sim))]
}

/// The first line where two texts differ, for the failure message.
fn first_difference(old: &str, new: &str) -> String {
    let (mut a, mut b) = (old.lines(), new.lines());
    for line in 1.. {
        match (a.next(), b.next()) {
            (None, None) => return "none".to_string(),
            (x, y) if x != y => {
                return format!(
                    "line {line}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end of file>"),
                    y.unwrap_or("<end of file>")
                )
            }
            _ => {}
        }
    }
    unreachable!()
}

#[test]
fn committed_headers_match_the_sources() {
    let update = std::env::var_os("SQDISC_UPDATE_HEADERS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (rel, text) in headers() {
        if rel == SCRIPTED_HEADER || rel == SIM_HEADER {
            assert!(text.contains("#include <sqdisc.h>"), "{rel} must include <sqdisc.h>");
        }
        let path = root().join(rel);
        let committed = fs::read_to_string(&path).unwrap_or_default();
        if committed == text {
            continue;
        }
        if update {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("wrote {rel}");
        } else {
            stale.push(format!("{rel} differs from the generated header; first difference at {}", {
                first_difference(&committed, &text)
            }));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nThe C headers are stale: run `make header` and commit include/.",
        stale.join("\n")
    );
}
