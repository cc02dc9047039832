//! The purity check of the pure layer (STYLE.md §6.2, §9 lesson 1), run by
//! `scripts/check-purity.sh` and so by `scripts/test`: every pure file is parsed with syn and
//! checked by `purity/check.rs`; a violation prints as `file:line: what` and fails the test.
//!
//! The first fence is the compiler's (issue #38): the pure set is its own crate,
//! `crates/aether-core`, whose `Cargo.toml` lists only the allowed crates, whose `std` is a facade
//! without files, sockets, processes or clocks, whose `lib.rs` shadows `include!` and `env!`, and
//! whose `clippy.toml` refuses the rest (`scratch_builds.rs` builds a scratch copy with each
//! trick and expects a failure). This check is the second net: it reads every file of that
//! crate, and the lab's plan (`src/lab/plan.rs`, pure but the lab's), as syn parses them.
//!
//! The second half of the file feeds the checker scratch sources, one trick each, and asserts that
//! each fails (and that a clean one passes).

#[path = "purity/check.rs"]
mod check;
#[path = "support/tree.rs"]
mod tree;

use std::collections::BTreeSet;
use std::path::Path;

use check::{ALLOWED_CRATES, Policy, Violation, check_source, child_modules, module_of};
use tree::{is_test_file, walk};

/// The pure crate: every file under it is in the set.
const CORE: &str = "crates/aether-core/src";

/// Pure files outside the pure crate: the lab's plan (the lab's, so not in aether-core, and pure
/// all the same). The child modules of a pure file are pure too and are added to the set.
const PURE_FILES: &[&str] = &[
    "crates/aether-lab/src/lab/plan.rs",
    "crates/aether-lab/src/lab/plan/render.rs",
];

/// Modules outside the pure file set that a pure file may still name, because they are plain
/// data. An entry needs a reason beside it.
const PLAIN_DATA: &[&str] = &[
    // aether-core's prelude and std facade (inline in its lib.rs): every file, the model's
    // included, imports them in place of std's prelude.
    "prelude", "facade",
];

/// The pure files, relative to the repository root, sorted.
fn pure_files(root: &Path) -> Vec<String> {
    let mut all = Vec::new();
    walk(&root.join("src"), &mut all);
    walk(&root.join(CORE), &mut all);
    walk(&root.join("crates/aether-lab/src"), &mut all);
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
        let core = rel.starts_with(&format!("{CORE}/"));
        if !test && (core || PURE_FILES.contains(&rel.as_str())) {
            files.insert(rel.clone());
        }
    }
    // A pure file's child modules are pure too (`convert.rs` -> `convert/filter.rs`).
    let parents: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(CORE))
        .map(|f| module_of(f))
        .collect();
    for (rel, test) in &rels {
        let module = module_of(rel);
        if !test
            && !rel.starts_with(CORE)
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
    let mut pure_modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    pure_modules.remove("");
    Policy {
        pure_modules,
        plain_data: PLAIN_DATA.iter().map(|s| (*s).to_owned()).collect(),
        // src/model never names crate::resolve (or any other module): the model's own types
        // live in model/target.rs.
        model_names_only_model: true,
        std_facade: Some("facade".to_owned()),
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
            let child_module = if module.is_empty() {
                child.clone()
            } else {
                format!("{module}::{child}")
            };
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
        "crates/aether-core/src/lib.rs",
        "crates/aether-core/src/model/mod.rs",
        "crates/aether-core/src/model/compile/routes.rs",
        "crates/aether-core/src/resolve/mod.rs",
        "crates/aether-core/src/registry/kube/convert.rs",
        "crates/aether-core/src/capture/plan.rs",
        "crates/aether-core/src/marks.rs",
        "crates/aether-lab/src/lab/plan/render.rs",
        "crates/aether-core/src/registry/kube/convert/routes.rs",
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
        std_facade: None,
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
    passes("extern crate alloc;");
}

// === The three tricks that passed the old check (issue #38), each a case that must fail ===

#[test]
fn a_build_time_read_of_a_file_that_is_not_rust_fails() {
    fails(r#"fn f() -> &'static str { include!("io.in") }"#);
    fails(r#"const T: &str = include_str!("table.txt");"#);
    fails(r#"const B: &[u8] = core::include_bytes!("blob");"#);
    fails(r#"const H: &str = env!("HOME");"#);
    fails(r#"fn f() -> Option<&'static str> { option_env!("X") }"#);
    fails(r#"fn f() -> String { format!("{}", include_str!("x")) }"#);
    fails(r#"#[path = "../../node/mod.rs"] mod sneaky;"#);
}

#[test]
fn io_through_a_method_fails() {
    fails(r#"fn f(p: &str) -> bool { Path::new(p).exists() }"#);
    fails(r#"fn f(p: &str) -> bool { std::path::Path::new(p).exists() }"#);
    fails(r#"fn f(p: &P) -> u64 { p.metadata().map(|m| m.len()).unwrap_or(0) }"#);
    fails(r#"fn f(p: &P) -> usize { p.read_dir().map(|d| d.count()).unwrap_or(0) }"#);
    fails(r#"fn f(t: T) -> u64 { t.elapsed().as_secs() }"#);
    fails(r#"fn f(p: &P) { tracing::info!("{}", p.exists()); }"#);
    // A field named like one is not a call.
    passes("fn f(o: &O) -> &M { &o.metadata }");
}

#[test]
fn a_crate_root_macro_that_expands_to_io_fails() {
    // The old check never read lib.rs: a macro defined there, above the pure modules, expanded
    // to IO inside them. aether-core's lib.rs is in the set now, and a macro's body is read.
    let root = |src: &str| check_source("lib.rs", "", src, &scratch_policy(true));
    let v = root(
        "macro_rules! slurp { ($p:expr) => { std::fs::read_to_string($p).unwrap() } }\npub mod model;",
    );
    assert!(!v.is_empty(), "{v:?}");
    let v = root("macro_rules! sneak { () => { ::std::env::var(\"X\") } }");
    assert!(!v.is_empty(), "{v:?}");
}

#[test]
fn the_facade_may_bind_std_and_its_re_exports_are_read_as_std() {
    let mut policy = scratch_policy(true);
    policy.std_facade = Some("facade".to_owned());
    policy.pure_modules.insert("facade".to_owned());
    let root = |src: &str| check_source("lib.rs", "", src, &policy);
    let clean = root(
        "pub mod facade { extern crate std as real; pub use self::real::{collections, fmt}; pub use core::net; }",
    );
    assert!(clean.is_empty(), "{clean:?}");
    assert!(
        !root("pub mod facade { extern crate std as real; pub use self::real::fs; }").is_empty()
    );
    assert!(
        !root("pub mod facade { extern crate std as real; pub use self::real::sync::Mutex; }")
            .is_empty()
    );
    // Anywhere but the facade, binding std is refused.
    assert!(!root("pub mod other { extern crate std as real; }").is_empty());
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
