//! The verbs structures as rdma-sys declares them agree with this system's <infiniband/verbs.h>.
//!
//! The library reads and writes `ibv_send_wr`, `ibv_recv_wr`, `ibv_sge` and `ibv_wc` that C code built, and
//! calls through `ibv_context_ops`; a difference in any size or offset would corrupt memory silently. The
//! test writes a C program that prints `sizeof`/`_Alignof`/`offsetof` for each entry below, builds it with
//! the system C compiler against the system headers, runs it, and compares every number with Rust's view.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use rdma_sys::*;

/// One number to compare: a C expression and what Rust says it is.
struct Entry {
    what: String,
    c_expr: String,
    rust: usize,
}

/// The size of a field's type, given an accessor (never called: it only names the field).
fn size_of_field<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `ty!(name)`: size and alignment of `struct name` against the Rust type of the same name.
macro_rules! ty {
    ($t:ident) => {
        vec![
            Entry {
                what: concat!("sizeof(struct ", stringify!($t), ")").to_string(),
                c_expr: concat!("sizeof(struct ", stringify!($t), ")").to_string(),
                rust: size_of::<$t>(),
            },
            Entry {
                what: concat!("_Alignof(struct ", stringify!($t), ")").to_string(),
                c_expr: concat!("_Alignof(struct ", stringify!($t), ")").to_string(),
                rust: align_of::<$t>(),
            },
        ]
    };
}

/// `field!(struct_name, rust.path => "c.path")`: offset and size of one (possibly nested) member. The Rust
/// path names rdma-sys' fields (its unions carry names where C's are anonymous); the C path is as C spells it.
macro_rules! field {
    ($t:ident, $($rf:ident).+ => $cf:literal) => {
        vec![
            Entry {
                what: concat!("offsetof(", stringify!($t), ", ", $cf, ")").to_string(),
                c_expr: concat!("offsetof(struct ", stringify!($t), ", ", $cf, ")").to_string(),
                rust: offset_of!($t, $($rf).+),
            },
            Entry {
                what: concat!("sizeof(", stringify!($t), ".", $cf, ")").to_string(),
                c_expr: concat!("sizeof(((struct ", stringify!($t), " *)0)->", $cf, ")").to_string(),
                #[allow(unused_unsafe)]
                rust: size_of_field(|s: &$t| unsafe { &s.$($rf).+ }),
            },
        ]
    };
}

fn entries() -> Vec<Entry> {
    let groups: Vec<Vec<Entry>> = vec![
        // struct ibv_sge
        ty!(ibv_sge),
        field!(ibv_sge, addr => "addr"),
        field!(ibv_sge, length => "length"),
        field!(ibv_sge, lkey => "lkey"),
        // struct ibv_recv_wr
        ty!(ibv_recv_wr),
        field!(ibv_recv_wr, wr_id => "wr_id"),
        field!(ibv_recv_wr, next => "next"),
        field!(ibv_recv_wr, sg_list => "sg_list"),
        field!(ibv_recv_wr, num_sge => "num_sge"),
        // struct ibv_send_wr
        ty!(ibv_send_wr),
        field!(ibv_send_wr, wr_id => "wr_id"),
        field!(ibv_send_wr, next => "next"),
        field!(ibv_send_wr, sg_list => "sg_list"),
        field!(ibv_send_wr, num_sge => "num_sge"),
        field!(ibv_send_wr, opcode => "opcode"),
        field!(ibv_send_wr, send_flags => "send_flags"),
        field!(ibv_send_wr, imm_data_invalidated_rkey_union.imm_data => "imm_data"),
        field!(ibv_send_wr, imm_data_invalidated_rkey_union.invalidated_rkey => "invalidate_rkey"),
        field!(ibv_send_wr, wr => "wr"),
        field!(ibv_send_wr, wr.rdma => "wr.rdma"),
        field!(ibv_send_wr, wr.rdma.remote_addr => "wr.rdma.remote_addr"),
        field!(ibv_send_wr, wr.rdma.rkey => "wr.rdma.rkey"),
        field!(ibv_send_wr, wr.atomic => "wr.atomic"),
        field!(ibv_send_wr, wr.atomic.remote_addr => "wr.atomic.remote_addr"),
        field!(ibv_send_wr, wr.atomic.compare_add => "wr.atomic.compare_add"),
        field!(ibv_send_wr, wr.atomic.swap => "wr.atomic.swap"),
        field!(ibv_send_wr, wr.atomic.rkey => "wr.atomic.rkey"),
        field!(ibv_send_wr, wr.ud => "wr.ud"),
        field!(ibv_send_wr, wr.ud.ah => "wr.ud.ah"),
        field!(ibv_send_wr, wr.ud.remote_qpn => "wr.ud.remote_qpn"),
        field!(ibv_send_wr, wr.ud.remote_qkey => "wr.ud.remote_qkey"),
        field!(ibv_send_wr, qp_type => "qp_type"),
        field!(ibv_send_wr, qp_type.xrc.remote_srqn => "qp_type.xrc.remote_srqn"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw => "bind_mw"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.mw => "bind_mw.mw"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.rkey => "bind_mw.rkey"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.bind_info => "bind_mw.bind_info"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.bind_info.mr => "bind_mw.bind_info.mr"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.bind_info.addr => "bind_mw.bind_info.addr"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.bind_info.length => "bind_mw.bind_info.length"),
        field!(ibv_send_wr, bind_mw_tso_union.bind_mw.bind_info.mw_access_flags
            => "bind_mw.bind_info.mw_access_flags"),
        field!(ibv_send_wr, bind_mw_tso_union.tso => "tso"),
        field!(ibv_send_wr, bind_mw_tso_union.tso.hdr => "tso.hdr"),
        field!(ibv_send_wr, bind_mw_tso_union.tso.hdr_sz => "tso.hdr_sz"),
        field!(ibv_send_wr, bind_mw_tso_union.tso.mss => "tso.mss"),
        // struct ibv_wc
        ty!(ibv_wc),
        field!(ibv_wc, wr_id => "wr_id"),
        field!(ibv_wc, status => "status"),
        field!(ibv_wc, opcode => "opcode"),
        field!(ibv_wc, vendor_err => "vendor_err"),
        field!(ibv_wc, byte_len => "byte_len"),
        field!(ibv_wc, imm_data_invalidated_rkey_union.imm_data => "imm_data"),
        field!(ibv_wc, imm_data_invalidated_rkey_union.invalidated_rkey => "invalidated_rkey"),
        field!(ibv_wc, qp_num => "qp_num"),
        field!(ibv_wc, src_qp => "src_qp"),
        field!(ibv_wc, wc_flags => "wc_flags"),
        field!(ibv_wc, pkey_index => "pkey_index"),
        field!(ibv_wc, slid => "slid"),
        field!(ibv_wc, sl => "sl"),
        field!(ibv_wc, dlid_path_bits => "dlid_path_bits"),
        // The operations the library calls through a context's table.
        ty!(ibv_context_ops),
        field!(ibv_context_ops, post_send => "post_send"),
        field!(ibv_context_ops, post_recv => "post_recv"),
        field!(ibv_context_ops, poll_cq => "poll_cq"),
        field!(ibv_context_ops, req_notify_cq => "req_notify_cq"),
        ty!(ibv_context),
        field!(ibv_context, device => "device"),
        field!(ibv_context, ops => "ops"),
        field!(ibv_context, ops.post_send => "ops.post_send"),
        field!(ibv_context, ops.post_recv => "ops.post_recv"),
        field!(ibv_context, ops.poll_cq => "ops.poll_cq"),
        field!(ibv_context, ops.req_notify_cq => "ops.req_notify_cq"),
        // The fields of a QP and a CQ the library reads.
        ty!(ibv_qp),
        field!(ibv_qp, context => "context"),
        field!(ibv_qp, send_cq => "send_cq"),
        field!(ibv_qp, recv_cq => "recv_cq"),
        field!(ibv_qp, qp_num => "qp_num"),
        field!(ibv_qp, qp_type => "qp_type"),
        field!(ibv_qp, state => "state"),
        ty!(ibv_cq),
        field!(ibv_cq, context => "context"),
        field!(ibv_cq, cqe => "cqe"),
        field!(ibv_cq, cq_context => "cq_context"),
    ];
    groups.into_iter().flatten().collect()
}

fn probe_source(entries: &[Entry]) -> String {
    let mut c = String::from(
        "/* Generated by tests/layout.rs. */\n\
         #include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\n\
         int main(void)\n{\n",
    );
    for e in entries {
        writeln!(c, "    printf(\"%s=%zu\\n\", \"{}\", (size_t)({}));", e.what, e.c_expr).unwrap();
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// `pkg-config --cflags libibverbs`, or nothing where pkg-config does not know it (headers in /usr/include).
fn verbs_cflags() -> Vec<String> {
    Command::new("pkg-config")
        .args(["--cflags", "libibverbs"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Builds and runs the probe; returns what C says, by entry.
fn c_layout(name: &str, entries: &[Entry]) -> BTreeMap<String, usize> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, probe_source(entries)).unwrap();

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(verbs_cflags())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "the layout probe {} did not compile:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );

    let run = Command::new(&exe).output().expect("run the layout probe");
    assert!(run.status.success(), "the layout probe failed: {run:?}");
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (k, v) = line.rsplit_once('=').expect("probe line is name=value");
            (k.to_string(), v.parse().expect("probe value is a number"))
        })
        .collect()
}

#[test]
fn verbs_structures_match_the_system_headers() {
    let entries = entries();
    let c = c_layout("layout_probe", &entries);
    assert_eq!(c.len(), entries.len(), "every entry is printed once by the probe (no duplicate names)");

    let mismatches: Vec<String> = entries
        .iter()
        .filter(|e| c[&e.what] != e.rust)
        .map(|e| format!("{}: C says {}, rdma-sys says {}", e.what, c[&e.what], e.rust))
        .collect();
    assert!(
        mismatches.is_empty(),
        "rdma-sys' verbs types disagree with <infiniband/verbs.h>:\n  {}",
        mismatches.join("\n  ")
    );
    println!("{} sizes and offsets agree", entries.len());
}

/// The comparison itself can fail: a probe entry with a deliberately wrong Rust value is caught.
#[test]
fn a_wrong_offset_would_be_reported() {
    let mut entries = field!(ibv_send_wr, wr.rdma.rkey => "wr.rdma.rkey");
    entries[0].rust += 4;
    let c = c_layout("layout_selftest", &entries[..1]);
    assert_ne!(c[&entries[0].what], entries[0].rust);
}
