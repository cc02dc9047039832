//! The purity check of the pure layer (STYLE.md §6.2, §9 lesson 1), run by
//! `scripts/check-purity.sh` and so by `scripts/test`: every pure file is parsed with syn and
//! checked by `purity/check.rs`; a violation prints as `file:line: what` and fails the test.
//!
//! syn rather than a workspace crate `aether-model`: STYLE.md §6.2 keeps the crate single until a
//! hard fence is needed, and the pure set includes scattered files (capture/plan.rs,
//! proxy/sniff.rs, the convert modules) that a crate boundary would not cover without moving them.
//! A parse sees what the compiler sees, which is what the old grep could not.
//!
//! The second half of the file feeds the checker scratch sources, one trick each, and asserts that
//! each fails (and that a clean one passes).

#[path = "purity/check.rs"]
mod check;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use check::{ALLOWED_CRATES, Policy, Violation, check_source, child_modules, module_of};

/// Files of the pure layer that are not under `src/model` or `src/resolve` (plus every
/// `convert.rs`). The child modules of a pure file are pure too and are added to the set.
const PURE_FILES: &[&str] = &[
    "src/capture/plan.rs",
    "src/proxy/sniff.rs",
    "src/identity/id.rs",
    "src/dns/table.rs",
    "src/dns/resolv.rs",
    "src/lab/plan.rs",
    "src/lab/plan/render.rs",
    "src/marks.rs",
    // Plain serde data (the MeshFilter resource) that convert/filter.rs reads: checked as pure
    // rather than excused as plain data.
    "src/registry/kube/mesh_filter.rs",
    // A pod as the mesh reads it, that convert.rs reads: the same.
    "src/registry/kube/pod.rs",
    // The registrar's election and the route-status merge: pure state machines, the clock given.
    "src/registrar/lease.rs",
    "src/route_status/merge.rs",
];

/// Modules outside the pure file set that a pure file may still name, because they are plain
/// data. Empty today; an entry needs a reason beside it.
const PLAIN_DATA: &[&str] = &[];

/// Test-only files, left out of the set (a test may read PROPTEST_CASES).
fn is_test_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name == "tests.rs" || name == "proptests.rs" || name.ends_with("_tests.rs")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The pure files, relative to the repository root, sorted.
fn pure_files(root: &Path) -> Vec<String> {
    let mut all = Vec::new();
    walk(&root.join("src"), &mut all);
    let rels: Vec<(String, bool)> = all
        .iter()
        .map(|path| {
            let rel = path
                .strip_prefix(root)
                .expect("walked from root")
                .to_string_lossy();
            (rel.into_owned(), is_test_file(path))
        })
        .collect();
    let mut files = BTreeSet::new();
    for (rel, test) in &rels {
        let layer0_dir = rel.starts_with("src/model/") || rel.starts_with("src/resolve/");
        let convert = rel.ends_with("/convert.rs");
        if !test && (layer0_dir || convert || PURE_FILES.contains(&rel.as_str())) {
            files.insert(rel.clone());
        }
    }
    // A pure file's child modules are pure too (`convert.rs` -> `convert/filter.rs`).
    let parents: Vec<String> = files.iter().map(|f| module_of(f)).collect();
    for (rel, test) in &rels {
        let module = module_of(rel);
        if !test
            && parents
                .iter()
                .any(|p| module.starts_with(&format!("{p}::")))
        {
            files.insert(rel.clone());
        }
    }
    files.into_iter().collect()
}

fn policy_for(files: &[String]) -> Policy {
    Policy {
        pure_modules: files.iter().map(|f| module_of(f)).collect(),
        plain_data: PLAIN_DATA.iter().map(|s| (*s).to_owned()).collect(),
        // src/model never names crate::resolve (or any other module): the model's own types
        // live in model/target.rs.
        model_names_only_model: true,
    }
}

/// Checks the real tree. Also fails when a pure file declares a child module that is not in the
/// set (it would be unchecked), or when a listed file is missing.
fn check_tree(root: &Path) -> (usize, Vec<Violation>) {
    let files = pure_files(root);
    let policy = policy_for(&files);
    let mut out = Vec::new();
    for listed in PURE_FILES {
        if !files.iter().any(|f| f == listed) {
            out.push(Violation {
                file: (*listed).to_owned(),
                line: 0,
                what: "listed as pure but missing: update PURE_FILES".to_owned(),
            });
        }
    }
    for file in &files {
        let src = std::fs::read_to_string(root.join(file)).expect("a pure file reads");
        let module = module_of(file);
        out.extend(check_source(file, &module, &src, &policy));
        for (child, line) in child_modules(&src) {
            let child_module = format!("{module}::{child}");
            if !policy.pure_modules.contains(&child_module) {
                out.push(Violation {
                    file: file.clone(),
                    line,
                    what: format!("`mod {child};` is not a pure file, so it would go unchecked"),
                });
            }
        }
    }
    (files.len(), out)
}

#[test]
fn the_pure_layer_reaches_for_no_io_clock_task_global_or_foreign_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (n, violations) = check_tree(root);
    assert!(
        violations.is_empty(),
        "purity: {} violation(s) in {n} pure files:\n{}",
        violations.len(),
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("purity: {n} pure files checked, none reaches for IO");
}

#[test]
fn the_file_set_covers_what_the_old_script_did() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = pure_files(root);
    for must in [
        "src/model/mod.rs",
        "src/model/compile/routes.rs",
        "src/resolve/mod.rs",
        "src/registry/kube/convert.rs",
        "src/capture/plan.rs",
        "src/marks.rs",
        "src/lab/plan/render.rs",
        "src/registry/kube/convert/routes.rs",
    ] {
        assert!(
            files.iter().any(|f| f == must),
            "{must} missing from {files:?}"
        );
    }
    assert!(!files.iter().any(|f| f.ends_with("proptests.rs")));
    assert!(ALLOWED_CRATES.contains(&"serde"));
}

// === The checker against scratch sources: every trick fails ===

fn scratch_policy(model_rule: bool) -> Policy {
    let pure = [
        "model",
        "model::names",
        "resolve",
        "capture::plan",
        "registry::kube::convert",
        "lab::plan",
        "identity::id",
        "marks",
    ];
    Policy {
        pure_modules: pure.iter().map(|s| (*s).to_owned()).collect(),
        plain_data: BTreeSet::new(),
        model_names_only_model: model_rule,
    }
}

/// Checks `src` as the file `src/resolve/scratch.rs` (module `resolve::scratch`).
fn check(src: &str) -> Vec<Violation> {
    check_source("scratch.rs", "resolve::scratch", src, &scratch_policy(true))
}

#[track_caller]
fn fails(src: &str) -> Vec<Violation> {
    let v = check(src);
    assert!(!v.is_empty(), "expected a violation in:\n{src}");
    v
}

#[track_caller]
fn passes(src: &str) {
    let v = check(src);
    assert!(v.is_empty(), "expected no violation, got {v:?} in:\n{src}");
}

#[test]
fn a_clean_file_passes() {
    passes(
        r#"
//! Talks about std::fs, tokio, async, Instant::now and static mut in prose only.
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use crate::model::names::Host;
use crate::capture::plan::{CapturePlan as Plan};
use super::decision::Why;
use serde::Serialize;

mod inner;
use inner::Thing;

/// Doc comment: `std::env::var("X")` and `tokio::spawn` are only words here.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct S<'a> { m: HashMap<String, u16>, a: Arc<str>, d: Duration, s: &'static str, r: &'a str }

const LIMIT: u32 = 3;

#[rustfmt::skip]
#[allow(clippy::needless_pass_by_value)]
pub fn f(x: u16) -> String {
    // std::fs::read("/etc/passwd") in a comment
    let s = "std::env::var(\"HOME\") and tokio::net::TcpStream in a string";
    let n = u16::MAX.min(x);
    let v: Vec<u8> = Vec::new();
    let m = HashMap::<u8, u8>::new();
    tracing::debug!(n, "ok {}", s);
    format!("{}{}{:?}{:?}", s, std::cmp::max(n, 1), v, m)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use tokio::net::TcpStream;
    static GLOBAL: u8 = 0;
    async fn t() { let _ = fs::read("x"); TcpStream::connect("x").await.unwrap(); }
}
"#,
    );
}

#[test]
fn grouped_imports_fail() {
    fails("use std::{fs, env};");
    fails("use std::{io::Read, net::TcpStream};");
    fails("use std::{collections::HashMap, sync::{Arc, Mutex}};");
    fails("use ::std::{fmt, process::Command};");
}

#[test]
fn renamed_imports_fail() {
    fails("use std::fs as f;");
    fails("use std::env::{self as e};");
    fails("use tokio as t;");
    fails("use std::time::Instant as Moment;");
    // The alias is followed to what it names.
    fails("use std as s; fn f() { let _ = s::fs::read(\"x\"); }");
    fails("use std::{self as s}; fn f() { let _ = s::env::var(\"X\"); }");
    fails("use super::super as root; fn f(_: root::proxy::Inputs) {}");
    fails("use std::sync; fn f() { let _ = sync::Mutex::new(0); }");
}

#[test]
fn glob_imports_of_banned_modules_fail() {
    fails("use std::fs::*;");
    fails("use std::sync::*;"); // holds Mutex
    fails("use std::time::*;"); // holds Instant
    fails("use std::net::*;"); // holds TcpStream
    fails("use tokio::prelude::*;");
    fails("use crate::proxy::*;");
    // A glob of a module with nothing banned is fine.
    passes("use std::collections::*;");
}

#[test]
fn paths_without_use_in_expressions_fail() {
    fails(r#"fn f() { let _ = std::fs::read("x"); }"#);
    fails(r#"fn f() { let _ = ::std::env::var("X"); }"#);
    fails(r#"fn f() { let _ = tokio::net::TcpStream::connect("a:1"); }"#);
    fails(r#"fn f() { let _ = std::net::TcpStream::connect("a:1"); }"#);
    fails(r#"fn f() { let c = std::net::TcpStream::connect; }"#);
    fails("fn f() -> u32 { rand::random() }");
    fails("fn f() -> u64 { fastrand::u64(..) }");
    fails("fn f() { let mut b = [0u8; 4]; getrandom::fill(&mut b).ok(); }");
    fails("fn f() { let _ = std::process::id(); }");
}

#[test]
fn paths_without_use_in_types_patterns_and_generics_fail() {
    fails("struct S { f: std::fs::File }");
    fails("fn f(_: Option<Vec<std::net::TcpStream>>) {}");
    fails("fn f() -> Box<dyn std::io::Read> { todo!() }");
    fails("type T = std::collections::HashMap<String, tokio::sync::Mutex<u8>>;");
    fails("fn f(e: std::io::ErrorKind) { match e { std::io::ErrorKind::Other => {} _ => {} } }");
    fails("fn f() { let _ = Vec::<std::time::Instant>::new(); }");
    fails("fn f<T: tokio::io::AsyncRead>(_: T) {}");
    fails("impl From<std::env::VarError> for E { fn from(_: std::env::VarError) -> Self { E } }");
}

#[test]
fn paths_inside_macro_tokens_fail() {
    fails(r#"fn f() -> String { format!("{:?}", std::env::var("X")) }"#);
    fails(r#"fn f() { println!("{:?}", ::std::fs::read("x")); }"#);
    fails(r#"fn f() { assert!(tokio::runtime::Handle::try_current().is_ok()); }"#);
    fails(r#"fn f() { let v = vec![std::time::SystemTime::UNIX_EPOCH]; }"#);
    fails(r#"fn f() { tracing::info!(t = ?Instant::now(), "x"); }"#);
    fails(r#"fn f() { debug_assert!(unsafe { g() }); }"#);
    fails(r#"macro_rules! m { () => { std::thread::sleep(d) } }"#);
    fails("tokio::select! { _ = a => {} }");
}

#[test]
fn threads_processes_and_clocks_fail() {
    fails("use std::thread;");
    fails("fn f() { std::thread::spawn(|| ()); }");
    fails("use std::process::Command;");
    fails("use std::time::Instant;");
    fails("use std::time::SystemTime;");
    fails("fn f(t: std::time::Instant) {}"); // any use, not only ::now
    fails("fn f(t: SystemTime) -> SystemTime { t }"); // via a glob or prelude we cannot see
    fails("fn f() -> u64 { std::time::UNIX_EPOCH.elapsed().unwrap().as_secs() }");
}

#[test]
fn globals_fail() {
    fails("use std::sync::OnceLock;");
    fails("use std::sync::LazyLock;");
    fails("use std::cell::OnceCell;");
    fails("use std::sync::Mutex;");
    fails("use std::sync::RwLock;");
    fails("use std::sync::atomic::{AtomicU64, Ordering};");
    fails("fn f(c: &AtomicUsize) {}");
    fails("static N: u32 = 1;");
    fails("static mut N: u32 = 1;");
    fails("pub(crate) static NAMES: &[&str] = &[];");
    fails("thread_local! { static X: u8 = 0; }");
    fails("std::thread_local! { static X: u8 = 0; }");
    fails("fn f() { static INNER: u8 = 0; }");
    fails(
        "fn f() -> u8 { let x = *CELL.get_or_init(|| 1); x } static CELL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();",
    );
}

#[test]
fn async_and_await_fail() {
    fails("async fn f() {}");
    fails("fn f() -> impl Future<Output = ()> { async {} }");
    fails("fn f() { let c = async || 1; }");
    fails("fn f(x: X) { let _ = x.await; }");
    fails("impl S { pub async fn g(&self) {} }");
    fails("trait T { async fn g(&self); }");
}

#[test]
fn randomness_fails() {
    fails("use rand::Rng;");
    fails("fn f() { let mut r = rand::thread_rng(); }");
    fails("use fastrand;");
    fails("fn f() { fastrand::shuffle(&mut v); }");
    fails("use getrandom::getrandom;");
    // Decision: std's HashMap and its RandomState are allowed (module docs of purity/check.rs).
    passes(
        "use std::collections::HashMap; use std::hash::RandomState; fn f() -> HashMap<u8, u8, RandomState> { HashMap::new() }",
    );
}

#[test]
fn unsafe_fails() {
    fails("fn f() { unsafe { g() } }");
    fails("unsafe fn f() {}");
    fails("unsafe impl Send for S {}");
    fails("unsafe trait T {}");
    fails(r#"extern "C" { fn abs(x: i32) -> i32; }"#);
    fails("type F = unsafe fn();");
}

#[test]
fn crate_paths_into_io_modules_fail() {
    fails("use crate::proxy::Inputs;");
    fails("use crate::capture::nft;");
    fails("use crate::capture::{plan::CapturePlan, nft::apply};");
    fails("use crate::registry::file::FileRegistry;");
    fails("use crate::node::Node;");
    fails("use crate::lab::Lab;");
    fails("use crate::state::ModelHandle;");
    fails("use crate::dns::server::Server;");
    fails("use crate::workload::echo;");
    fails("use crate::identity::Ca;");
    fails("use crate::netns::Netns;");
    fails("use crate::time::now;");
    fails("fn f() { let _ = crate::time::now(); }");
    fails("fn f(h: &crate::state::ModelHandle) {}");
    fails(r#"fn f() { tracing::info!("{:?}", crate::time::now()); }"#);
    // Relative paths resolve from the file's module (resolve::scratch).
    fails("use super::super::proxy::Inputs;");
    fails("fn f() { super::super::time::now(); }");
    // Pure modules are fine.
    passes(
        "use crate::capture::plan::CapturePlan; use crate::identity::id::SpiffeId; use crate::marks; use super::Decision;",
    );
}

#[test]
fn extern_crate_fails() {
    fails("extern crate tokio;");
    fails("extern crate std as s;");
}

#[test]
fn crates_outside_the_allow_list_fail() {
    fails("use serde_json::Value;");
    fails("use hyper::Request;");
    fails("use arc_swap::ArcSwap;");
    fails("fn f() -> serde_json::Value { serde_json::json!({}) }");
    fails("use dashmap::DashMap;");
    passes("use ipnet::IpNet; use http::StatusCode; use thiserror::Error; use regex::Regex;");
}

#[test]
fn the_model_never_names_resolve() {
    let p = scratch_policy(true);
    let model = |src: &str| check_source("m.rs", "model::scratch", src, &p);
    assert!(!model("use crate::resolve::decision::ServiceKey;").is_empty());
    assert!(!model("fn f(_: crate::resolve::Decision) {}").is_empty());
    assert!(!model("use super::super::resolve::answer::ServiceLine;").is_empty());
    assert!(!model("use crate::capture::plan::CapturePlan;").is_empty());
    assert!(model("use crate::model::names::Host; use super::names::Host as H;").is_empty());
    // resolve may name the model.
    assert!(check("use crate::model::Model;").is_empty());
}

#[test]
fn a_violation_prints_as_file_line_what() {
    let v = check_source(
        "src/resolve/x.rs",
        "resolve::x",
        "//! doc\n\nuse std::fs;\n",
        &scratch_policy(true),
    );
    assert_eq!(v.len(), 1);
    let shown = v[0].to_string();
    assert!(shown.starts_with("src/resolve/x.rs:3: "), "{shown}");
}

#[test]
fn test_only_items_are_exempt_but_cfg_any_test_is_not() {
    passes("#[cfg(test)] fn t() { let _ = std::fs::read(\"x\"); }");
    passes("#[cfg(all(test, unix))] mod t { use tokio::net::TcpStream; }");
    fails("#[cfg(any(test, feature = \"testing\"))] fn t() { let _ = std::fs::read(\"x\"); }");
    fails("#[cfg(not(test))] use std::fs;");
}

#[test]
fn child_modules_of_a_pure_file_are_listed() {
    let mods = child_modules("mod a; pub mod b; #[cfg(test)] mod tests; mod c { }");
    let names: Vec<_> = mods.into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "b"]);
}
