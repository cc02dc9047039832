//! The purity checker: parses a pure-layer file with syn and reports every place where it
//! reaches for IO, a clock, tasks, globals, randomness, `unsafe`, a crate outside the Layer-0
//! allow-list, or a module of this crate that is not itself pure (STYLE.md §6.2).
//!
//! It looks at what the compiler looks at: every `use` tree (grouped, renamed, glob), every path
//! in expressions, types, patterns, generic arguments, attributes and macro paths, and the tokens
//! of every macro invocation (rebuilt into paths). Comments are not tokens and string literals
//! are literals, so prose never trips it. Items under `#[cfg(test)]` are skipped (test files are
//! left out of the file set by the caller).
//!
//! Decisions, so that a reviewer can disagree with them in one place:
//! - std's `HashMap`/`HashSet` with the default hasher (and `RandomState`) are allowed: the seed
//!   only changes iteration order, and the model's determinism property tests (STYLE.md §6.6)
//!   catch any order that leaks into a result.
//! - `Mutex`, `RwLock`, `Once*`, `Lazy*` and atomics are banned even as locals: the pure layer
//!   has no business synchronising, and a global needs one of them or a `static`.
//! - A path whose first segment is lower-case, not a primitive type, and not declared or imported
//!   in the file is read as a crate name (Rust 2018 paths), so `rand::random()` without a `use`
//!   is caught even though `rand` is not a dependency.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// Crates a pure file may name: std, and the Layer-0 allow-list of scripts/check-purity.sh.
pub(crate) const ALLOWED_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    // The pure crate itself, as the lab's plan names it.
    "aether_core",
    "serde",
    "ipnet",
    "http",
    "thiserror",
    "tracing",
    "regex",
    "k8s_openapi",
    "gateway_api",
    "proptest",
];

/// Paths under std/core/alloc that mean IO, a clock, tasks, globals or process state. A path is
/// banned when it starts with one of these (after the crate).
const BANNED_STD: &[&str] = &[
    "fs",
    "env",
    "io",
    "os",
    "process",
    "thread",
    "task",
    "future",
    "net::TcpStream",
    "net::TcpListener",
    "net::UdpSocket",
    "net::ToSocketAddrs",
    "net::Incoming",
    "time::Instant",
    "time::SystemTime",
    "time::UNIX_EPOCH",
    "sync::Mutex",
    "sync::RwLock",
    "sync::OnceLock",
    "sync::LazyLock",
    "sync::Once",
    "sync::Condvar",
    "sync::Barrier",
    "sync::mpsc",
    "sync::mpmc",
    "sync::atomic",
    "cell::OnceCell",
    "cell::LazyCell",
    "random",
];

/// Names that are banned wherever they appear in a path (a second net under the import check,
/// and the main one inside macro tokens).
const BANNED_NAMES: &[&str] = &[
    "Instant",
    "SystemTime",
    "UNIX_EPOCH",
    "OnceLock",
    "LazyLock",
    "OnceCell",
    "LazyCell",
    "Mutex",
    "RwLock",
    "Condvar",
    "AtomicBool",
    "AtomicU8",
    "AtomicU16",
    "AtomicU32",
    "AtomicU64",
    "AtomicUsize",
    "AtomicI8",
    "AtomicI16",
    "AtomicI32",
    "AtomicI64",
    "AtomicIsize",
    "AtomicPtr",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "thread_rng",
    "thread_local",
    "lazy_static",
];

/// Macros that read the build machine's files or environment: a pure file gets its data as
/// arguments (issue #38: `include!("io.in")` of a file that is not `.rs` passed the old check).
const BANNED_MACROS: &[&str] = &[
    "include",
    "include_str",
    "include_bytes",
    "env",
    "option_env",
];

/// Methods that do IO or read a clock on a value the file was handed (a `Path`, an `Instant`):
/// a path check cannot see a method's receiver type, so these are refused by name wherever they
/// are called (issue #38: `Path::new(p).exists()` passed the old check).
const BANNED_METHODS: &[&str] = &[
    "exists",
    "try_exists",
    "metadata",
    "symlink_metadata",
    "read_dir",
    "read_link",
    "canonicalize",
    "is_file",
    "is_dir",
    "is_symlink",
    "elapsed",
];

/// Keywords a pure file may not use, also caught inside macro tokens.
const BANNED_KEYWORDS: &[&str] = &["async", "await", "unsafe", "static"];

const PRIMITIVES: &[&str] = &[
    "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64",
    "i128", "isize", "f32", "f64",
];

/// Tool namespaces of attributes (`#[rustfmt::skip]`, `#[allow(clippy::x)]`).
const TOOLS: &[&str] = &["rustfmt", "clippy", "rustdoc", "diagnostic"];

/// What one file may name of this crate.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Module paths (`model::compile`, `capture::plan`) of the pure files: a `crate::` path is
    /// allowed when one of these is a prefix of it.
    pub(crate) pure_modules: BTreeSet<String>,
    /// Module paths that are plain data though their files are not in the set.
    pub(crate) plain_data: BTreeSet<String>,
    /// Files under `src/model` may name only `crate::model` (and `plain_data`), never
    /// `crate::resolve` (ARCHITECTURE.md "Who may import whom").
    pub(crate) model_names_only_model: bool,
    /// The one module that may bind `std` by `extern crate std as ..`: aether-core's facade
    /// (its `lib.rs`), whose re-exports are then checked as `std` paths. `None`: no module may.
    pub(crate) std_facade: Option<String>,
}

/// One finding, printed as `file:line: what`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// The module path of a file under a crate's `src/`: `src/model/mod.rs` -> `model`,
/// `src/lab/plan/render.rs` -> `lab::plan::render`, `crates/aether-core/src/model/live.rs` ->
/// `model::live`, a crate's `lib.rs` -> `` (the root).
pub(crate) fn module_of(rel: &str) -> String {
    let rel = rel.strip_prefix("crates/aether-core/").unwrap_or(rel);
    let rel = rel.strip_prefix("crates/aether-lab/").unwrap_or(rel);
    let rel = rel.strip_prefix("src/").unwrap_or(rel);
    if rel == "lib.rs" {
        return String::new();
    }
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    rel.replace('/', "::")
}

/// Checks one file's source. `module` is its module path (see [`module_of`]).
pub(crate) fn check_source(file: &str, module: &str, src: &str, policy: &Policy) -> Vec<Violation> {
    let parsed = match syn::parse_file(src) {
        Ok(f) => f,
        Err(e) => {
            return vec![Violation {
                file: file.to_owned(),
                line: e.span().start().line,
                what: format!("does not parse: {e}"),
            }];
        }
    };
    let mut locals = Locals::default();
    collect_locals(&parsed.items, &mut locals);
    let mut checker = Checker {
        file,
        module: module
            .split("::")
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect(),
        policy,
        locals,
        in_use: false,
        out: Vec::new(),
    };
    checker.visit_file(&parsed);
    checker.out.sort_by_key(|v| v.line);
    checker.out.dedup();
    checker.out
}

/// The `mod x;` declarations (no body, not under `cfg(test)`) of a file: each must be a pure file
/// too, or the file could hide IO in a child module.
pub(crate) fn child_modules(src: &str) -> Vec<(String, usize)> {
    let Ok(parsed) = syn::parse_file(src) else {
        return Vec::new();
    };
    parsed
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if m.content.is_none() && !is_test_only(&m.attrs) => {
                Some((m.ident.to_string(), m.ident.span().start().line))
            }
            _ => None,
        })
        .collect()
}

/// Names a file brings into scope that may start a path: imports (their last segment or
/// rename), modules, `extern crate`s. Collected over the whole file (an over-approximation: what
/// they name is checked where they are declared).
#[derive(Debug, Default)]
struct Locals {
    /// `mod x` and `extern crate x` names.
    mods: BTreeSet<String>,
    /// What each `use` brings in (the last segment, or the rename) -> the path it names, so that
    /// `use std as s; s::fs::read(..)` is checked as `std::fs::read`.
    imports: BTreeMap<String, Vec<String>>,
    /// `extern crate std as x` names: a path through one is checked as a `std` path.
    std_aliases: BTreeSet<String>,
}

fn collect_locals(items: &[syn::Item], out: &mut Locals) {
    // `prefix` is the path before this tree; `use std::fmt::{self}` imports `fmt`.
    fn tree(t: &syn::UseTree, prefix: &mut Vec<String>, out: &mut BTreeMap<String, Vec<String>>) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                tree(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if n.ident == "self" => {
                if let Some(last) = prefix.last() {
                    out.insert(last.clone(), prefix.clone());
                }
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                full.push(n.ident.to_string());
                out.insert(n.ident.to_string(), full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                out.insert(r.rename.to_string(), full);
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| tree(t, prefix, out)),
        }
    }
    for item in items {
        match item {
            syn::Item::Use(u) if !is_test_only(&u.attrs) => {
                tree(&u.tree, &mut Vec::new(), &mut out.imports);
            }
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                out.mods.insert(m.ident.to_string());
                if let Some((_, inner)) = &m.content {
                    collect_locals(inner, out);
                }
            }
            syn::Item::Fn(f) if !is_test_only(&f.attrs) => {
                // `use` inside a function body (e.g. `use super::filters;`).
                let mut inner = BlockItems(Vec::new());
                inner.visit_block(&f.block);
                collect_locals(&inner.0, out);
            }
            syn::Item::Impl(i) if !is_test_only(&i.attrs) => {
                for item in &i.items {
                    if let syn::ImplItem::Fn(f) = item {
                        let mut inner = BlockItems(Vec::new());
                        inner.visit_block(&f.block);
                        collect_locals(&inner.0, out);
                    }
                }
            }
            syn::Item::ExternCrate(e) => {
                out.mods.insert(e.ident.to_string());
                if let Some((_, rename)) = &e.rename {
                    out.mods.insert(rename.to_string());
                    if e.ident == "std" {
                        out.std_aliases.insert(rename.to_string());
                    }
                }
            }
            _ => {}
        }
    }
}

/// The items declared inside a block (and its nested blocks).
struct BlockItems(Vec<syn::Item>);

impl<'ast> Visit<'ast> for BlockItems {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        self.0.push(item.clone());
    }
}

/// True when the attributes make the item exist only in test builds: `#[cfg(test)]` or
/// `#[cfg(all(.., test, ..))]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    fn implies_test(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|metas| metas.iter().any(implies_test)),
            _ => false,
        }
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| implies_test(&m))
    })
}

struct Checker<'a> {
    file: &'a str,
    /// The current module path (grows inside inline `mod x { .. }`).
    module: Vec<String>,
    policy: &'a Policy,
    locals: Locals,
    /// Inside a `use` item: the first segment of a path is always a crate or module there.
    in_use: bool,
    out: Vec<Violation>,
}

impl Checker<'_> {
    fn report(&mut self, span: Span, what: impl Into<String>) {
        self.out.push(Violation {
            file: self.file.to_owned(),
            line: span.start().line,
            what: what.into(),
        });
    }

    /// Checks one path given as segments; `glob` when it ends in `::*`. A path that starts with
    /// an imported name is checked as the path the import names (once: `use getrandom::getrandom`
    /// expands to `getrandom::getrandom::..`, whose crate is then checked).
    fn check_segments(&mut self, span: Span, leading_colon: bool, segs: &[String], glob: bool) {
        let expanded;
        let segs = match segs.first().and_then(|f| self.locals.imports.get(f)) {
            Some(full) if !leading_colon && !full.is_empty() => {
                expanded = full.iter().chain(&segs[1..]).cloned().collect::<Vec<_>>();
                &expanded[..]
            }
            _ => segs,
        };
        // A path through the facade's binding of std (`self::real::fs`, `real::fs`) is a std path.
        let through_alias = match segs {
            [s, alias, rest @ ..] if s == "self" && self.locals.std_aliases.contains(alias) => {
                Some(rest)
            }
            [alias, rest @ ..] if self.locals.std_aliases.contains(alias) => Some(rest),
            _ => None,
        };
        if let Some(rest) = through_alias {
            let shown = format!("std::{}{}", rest.join("::"), if glob { "::*" } else { "" });
            self.check_std(span, &shown, rest, glob);
            return;
        }
        let Some(first) = segs.first() else { return };
        let shown = {
            let mut s = String::new();
            if leading_colon {
                s.push_str("::");
            }
            s.push_str(&segs.join("::"));
            if glob {
                s.push_str("::*");
            }
            s
        };
        for seg in segs {
            if BANNED_NAMES.contains(&seg.as_str()) {
                self.report(
                    span,
                    format!("`{shown}` names `{seg}` (clock, globals, sockets or randomness)"),
                );
                return;
            }
        }
        match first.as_str() {
            "crate" | "self" | "super" if !leading_colon => {
                self.check_crate_path(span, &shown, segs, glob);
            }
            "Self" => {}
            _ => {
                let is_crate = leading_colon
                    || (!self.locals.mods.contains(first)
                        && !PRIMITIVES.contains(&first.as_str())
                        && first.starts_with(|c: char| c.is_ascii_lowercase())
                        && (segs.len() > 1 || glob || self.in_use));
                if !is_crate {
                    return;
                }
                if !ALLOWED_CRATES.contains(&first.as_str()) {
                    self.report(
                        span,
                        format!("`{shown}`: crate `{first}` is outside the Layer-0 allow-list"),
                    );
                    return;
                }
                if matches!(first.as_str(), "std" | "core" | "alloc") {
                    self.check_std(span, &shown, &segs[1..], glob);
                }
            }
        }
    }

    fn check_std(&mut self, span: Span, shown: &str, rest: &[String], glob: bool) {
        let rest = rest.join("::");
        for banned in BANNED_STD {
            let hit = rest == *banned
                || rest.starts_with(&format!("{banned}::"))
                // A glob of a module that holds a banned item brings it in.
                || (glob && (rest.is_empty() || banned.starts_with(&format!("{rest}::"))));
            if hit {
                self.report(
                    span,
                    format!("`{shown}` reaches for IO, a clock, tasks or globals"),
                );
                return;
            }
        }
    }

    /// A `crate::`/`self::`/`super::` path: resolve it to a module path and require a pure
    /// module (or a plain-data one) as its prefix.
    fn check_crate_path(&mut self, span: Span, shown: &str, segs: &[String], glob: bool) {
        let mut abs: Vec<String> = Vec::new();
        let mut rest = segs;
        match segs[0].as_str() {
            "crate" => rest = &segs[1..],
            _ => {
                abs = self.module.clone();
                while let Some(s) = rest.first() {
                    match s.as_str() {
                        "self" => rest = &rest[1..],
                        "super" => {
                            abs.pop();
                            rest = &rest[1..];
                        }
                        _ => break,
                    }
                }
            }
        }
        abs.extend(rest.iter().cloned());
        if abs.is_empty() {
            if glob {
                self.report(span, format!("`{shown}`: glob of the crate root"));
            }
            return;
        }
        // Model types live in `model`; `resolve` imports `model`, never the reverse
        // (ARCHITECTURE.md "Who may import whom").
        let in_model =
            self.policy.model_names_only_model && self.module.first().is_some_and(|m| m == "model");
        let allowed = |prefix: &str| {
            if in_model {
                prefix == "model" || self.policy.plain_data.contains(prefix)
            } else {
                self.policy.pure_modules.contains(prefix) || self.policy.plain_data.contains(prefix)
            }
        };
        let pure = (1..=abs.len()).any(|n| allowed(&abs[..n].join("::")));
        if !pure {
            let target = abs.join("::");
            let why = if in_model {
                "src/model may name only crate::model (and plain-data modules)"
            } else {
                "not a pure module"
            };
            self.report(span, format!("`{shown}` names crate::{target}: {why}"));
        }
    }

    fn check_use_tree(&mut self, prefix: &mut Vec<String>, leading: bool, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.check_use_tree(prefix, leading, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                if n.ident == "self" {
                    self.check_segments(n.ident.span(), leading, &prefix.clone(), false);
                } else {
                    prefix.push(n.ident.to_string());
                    self.check_segments(n.ident.span(), leading, &prefix.clone(), false);
                    prefix.pop();
                }
            }
            syn::UseTree::Rename(r) => {
                if r.ident != "self" {
                    prefix.push(r.ident.to_string());
                }
                let segs = prefix.clone();
                self.check_segments(r.ident.span(), leading, &segs, false);
                if r.ident != "self" {
                    prefix.pop();
                }
            }
            syn::UseTree::Glob(g) => {
                self.check_segments(g.star_token.span, leading, &prefix.clone(), true);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.check_use_tree(prefix, leading, t);
                }
            }
        }
    }

    /// Scans a macro's (or attribute's) tokens: banned keywords, and every `a::b::c` run rebuilt
    /// into a path and checked like one.
    fn scan_tokens(&mut self, tokens: TokenStream, skip_tools: bool) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream(), skip_tools);
                    i += 1;
                }
                TokenTree::Literal(_) => i += 1,
                TokenTree::Punct(p) if p.as_char() == '\'' => i += 2, // a lifetime: 'static
                // `.exists()` inside a macro's arguments.
                TokenTree::Punct(p)
                    if p.as_char() == '.'
                        && matches!(trees.get(i + 1), Some(TokenTree::Ident(m)) if BANNED_METHODS.contains(&m.to_string().as_str()))
                        && matches!(trees.get(i + 2), Some(TokenTree::Group(g)) if g.delimiter() == proc_macro2::Delimiter::Parenthesis) =>
                {
                    if let Some(TokenTree::Ident(m)) = trees.get(i + 1) {
                        self.report(m.span(), format!("`.{m}()` does IO or reads a clock"));
                    }
                    i += 2;
                }
                // `include!(..)` inside another macro's tokens.
                TokenTree::Ident(m)
                    if BANNED_MACROS.contains(&m.to_string().as_str())
                        && matches!(trees.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!') =>
                {
                    self.report(
                        m.span(),
                        format!("`{m}!` reads the build machine's files or environment"),
                    );
                    i += 2;
                }
                TokenTree::Punct(_) | TokenTree::Ident(_) => {
                    // Try a path here: [::] ident (:: ident)*
                    let start = i;
                    let mut j = i;
                    let leading = is_colons(&trees, j);
                    if leading {
                        j += 2;
                    }
                    let mut segs = Vec::new();
                    let mut span = None;
                    while let Some(TokenTree::Ident(id)) = trees.get(j) {
                        span.get_or_insert(id.span());
                        segs.push(id.to_string());
                        j += 1;
                        if is_colons(&trees, j)
                            && matches!(trees.get(j + 2), Some(TokenTree::Ident(_)))
                        {
                            j += 2;
                        } else {
                            break;
                        }
                    }
                    let glob = is_colons(&trees, j)
                        && matches!(trees.get(j + 2), Some(TokenTree::Punct(p)) if p.as_char() == '*');
                    if let Some(span) = span {
                        for s in &segs {
                            if BANNED_KEYWORDS.contains(&s.as_str()) {
                                self.report(span, format!("`{s}` inside a macro invocation"));
                            }
                        }
                        let tool = skip_tools && TOOLS.contains(&segs[0].as_str());
                        if !tool && (segs.len() > 1 || leading || glob) {
                            self.check_segments(span, leading, &segs, glob);
                        } else if !tool {
                            // A lone identifier: only the banned names matter.
                            if BANNED_NAMES.contains(&segs[0].as_str()) {
                                self.report(
                                    span,
                                    format!("`{}` inside a macro invocation", segs[0]),
                                );
                            }
                        }
                        i = j;
                    } else {
                        i = start + 1;
                    }
                }
            }
        }
    }
}

fn is_colons(trees: &[TokenTree], j: usize) -> bool {
    matches!(
        (trees.get(j), trees.get(j + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':' && a.spacing() == proc_macro2::Spacing::Joint
    )
}

impl<'ast> Visit<'ast> for Checker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        match item {
            syn::Item::Static(s) => {
                let what = if matches!(s.mutability, syn::StaticMutability::Mut(_)) {
                    "`static mut` item (global state)"
                } else {
                    "`static` item (global state)"
                };
                self.report(s.static_token.span, what);
            }
            syn::Item::ExternCrate(e) => {
                let facade = self.policy.std_facade.as_deref() == Some(&self.module.join("::"));
                let allowed = e.ident == "alloc" || (e.ident == "std" && facade);
                if !allowed {
                    self.report(e.extern_token.span, format!("`extern crate {}`", e.ident));
                }
            }
            syn::Item::ForeignMod(f) => {
                self.report(f.abi.extern_token.span, "`extern` block (foreign code)");
            }
            syn::Item::Impl(i) => {
                if let Some(u) = i.unsafety {
                    self.report(u.span, "`unsafe impl`");
                }
            }
            syn::Item::Trait(t) => {
                if let Some(u) = t.unsafety {
                    self.report(u.span, "`unsafe trait`");
                }
            }
            syn::Item::Use(u) => {
                self.in_use = true;
                let leading = u.leading_colon.is_some();
                self.check_use_tree(&mut Vec::new(), leading, &u.tree);
                self.in_use = false;
                return;
            }
            syn::Item::Mod(m) if m.attrs.iter().any(|a| a.path().is_ident("path")) => {
                self.report(
                    m.ident.span(),
                    format!(
                        "`#[path]` on `mod {}`: a module elsewhere goes unchecked",
                        m.ident
                    ),
                );
            }
            syn::Item::Mod(m) if m.content.is_some() => {
                self.module.push(m.ident.to_string());
                visit::visit_item(self, item);
                self.module.pop();
                return;
            }
            _ => {}
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    /// `pub(super)`, `pub(in crate::x)`: a visibility names no item.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if let Some(a) = sig.asyncness {
            self.report(a.span, format!("`async fn {}`", sig.ident));
        }
        if let Some(u) = sig.unsafety {
            self.report(u.span, format!("`unsafe fn {}`", sig.ident));
        }
        visit::visit_signature(self, sig);
    }

    fn visit_expr_async(&mut self, e: &'ast syn::ExprAsync) {
        self.report(e.async_token.span, "`async` block");
        visit::visit_expr_async(self, e);
    }

    fn visit_expr_await(&mut self, e: &'ast syn::ExprAwait) {
        self.report(e.await_token.span, "`.await`");
        visit::visit_expr_await(self, e);
    }

    fn visit_expr_closure(&mut self, e: &'ast syn::ExprClosure) {
        if let Some(a) = e.asyncness {
            self.report(a.span, "`async` closure");
        }
        visit::visit_expr_closure(self, e);
    }

    fn visit_expr_unsafe(&mut self, e: &'ast syn::ExprUnsafe) {
        self.report(e.unsafe_token.span, "`unsafe` block");
        visit::visit_expr_unsafe(self, e);
    }

    fn visit_type_bare_fn(&mut self, t: &'ast syn::TypeBareFn) {
        if let Some(u) = t.unsafety {
            self.report(u.span, "`unsafe fn` pointer type");
        }
        visit::visit_type_bare_fn(self, t);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let span = path
            .segments
            .first()
            .map_or_else(Span::call_site, |s| s.ident.span());
        self.check_segments(span, path.leading_colon.is_some(), &segs, false);
        visit::visit_path(self, path);
    }

    fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
        if BANNED_METHODS.contains(&e.method.to_string().as_str()) {
            self.report(
                e.method.span(),
                format!("`.{}()` does IO or reads a clock", e.method),
            );
        }
        visit::visit_expr_method_call(self, e);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Some(last) = mac.path.segments.last()
            && BANNED_MACROS.contains(&last.ident.to_string().as_str())
        {
            self.report(
                last.ident.span(),
                format!(
                    "`{}!` reads the build machine's files or environment",
                    last.ident
                ),
            );
        }
        if let Some(last) = mac.path.segments.last()
            && (last.ident == "thread_local" || last.ident == "lazy_static")
        {
            self.report(
                last.ident.span(),
                format!("`{}!` (global state)", last.ident),
            );
        }
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone(), false);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        let path = attr.path();
        let tool = path
            .segments
            .first()
            .is_some_and(|s| TOOLS.contains(&s.ident.to_string().as_str()));
        if !tool {
            self.visit_path(path);
        }
        if let syn::Meta::List(list) = &attr.meta
            && !path.is_ident("doc")
        {
            self.scan_tokens(list.tokens.clone(), true);
        }
    }
}
