//! Fuzz targets for every parser that takes bytes from the network or from users (issue #8
//! §3), on the stable toolchain: each test replays its corpus (`tests/fuzz/corpus/<target>/`)
//! and then runs a bounded random pass of mutations of it (`tests/fuzz/engine.rs`).
//!
//! `cargo test --test fuzz` runs every target for 2 s (CI); `AETHER_FUZZ_SECS`,
//! `AETHER_FUZZ_RUNS`, `AETHER_FUZZ_SEED` (`random` for a fresh one) and
//! `AETHER_FUZZ_HANG_SECS` bound a longer run. A failing input is written to
//! `target/fuzz-failures/<target>-<hash>` and printed in hex; docs/fuzzing.md says how to
//! reproduce it and add it to the corpus.
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

#[path = "fuzz/engine.rs"]
mod engine;
#[path = "fuzz/fixture.rs"]
mod fixture;

#[path = "fuzz/targets/mod.rs"]
mod targets;

/// A signature of an outcome, for the engine's outcome feedback.
fn outcome<T: std::fmt::Debug + ?Sized>(value: &T) -> u64 {
    engine::fnv(format!("{value:?}").as_bytes())
}

#[test]
fn sniff() {
    engine::fuzz(&targets::sniff::TARGET);
}

#[test]
fn client_hello() {
    engine::fuzz(&targets::client_hello::TARGET);
}

#[test]
fn http_head() {
    engine::fuzz(&targets::http_head::TARGET);
}

#[test]
fn authority() {
    engine::fuzz(&targets::authority::TARGET);
}

#[test]
fn annotations() {
    engine::fuzz(&targets::annotations::TARGET);
}

#[test]
fn manifests() {
    engine::fuzz(&targets::manifests::TARGET);
}

#[test]
fn dns() {
    engine::fuzz(&targets::dns::TARGET);
}

#[test]
fn cni() {
    engine::fuzz(&targets::cni::TARGET);
}

#[test]
fn route_match() {
    engine::fuzz(&targets::route_match::TARGET);
}
