//! libsqdisc_check: a send-queue discipline checker for verbs programs that do not use sqdisc.
//!
//! Preloaded (`LD_PRELOAD=libsqdisc_check.so`), it interposes libibverbs' control-path functions
//! ([`edge::interpose`]) and, on each device context a program uses, replaces the data-path entries of the
//! context's ops table (`post_send`, `post_recv`, `poll_cq`) with wrappers that check every WR and
//! completion against the four rules before forwarding to the provider ([`edge::ops`]). In-process, the same
//! checker is driven through the `sqd_check_*` functions ([`edge::api`], `check/include/sqdisc_check.h`).
//! The rules themselves ([`rules`]) are safe Rust over plain values. docs/check.md is the user's guide.

pub mod edge;
pub mod rules;
