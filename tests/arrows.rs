//! Who may import whom (issue #38), read from the module imports of the three crates: no circle
//! between modules, and no arrow the wrong way. Run by `scripts/check-arrows` and so by
//! `scripts/test`.
//!
//! The crate boundaries are the compiler's: aether-core cannot name the daemon or the lab, and
//! the daemon cannot name the lab outside its tests. This check reads what a crate boundary
//! cannot see:
//! - **circles**: a module that names another which names it back, directly or around a longer
//!   loop. The nodes are the modules of files; an arrow is a path in a `use` or in code
//!   (`crate::`, `self::`, `super::`, or `aether::`/`aether_core::` from the lab) to a module
//!   that is neither the file's own nor one of its ancestors or descendants (a child naming its
//!   parent's items, and a parent its child's, is how a module is built, not a circle);
//! - **wrong-way arrows**: in the daemon, only `node` (the wiring) names `node`: a part never
//!   reaches up into the daemon that runs it (counters, settings and the like belong to the part,
//!   and `node` gathers them); the lab never names the daemon's `proxy` (it tests the proxy from
//!   outside, through sockets; the wire's constants are aether-core's).
//!
//! Test code (`tests.rs`, `*_tests.rs`, `proptests.rs`, items under `#[cfg(test)]`) is left
//! out: a test may reach anywhere in its crate.
//!
//! The same reading holds the daemon's functions to a length (issue #38): no function or method
//! of `src/` (tests, nested functions and trait defaults included) is longer than
//! [`MAX_FN_LINES`], counted from its `fn` to its closing brace.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};

#[path = "support/tree.rs"]
mod tree;

/// A crate: its name in paths, its source root, relative to the workspace.
const CRATES: &[(&str, &str)] = &[
    ("aether_core", "crates/aether-core/src"),
    ("aether", "src"),
    ("aether_lab", "crates/aether-lab/src"),
];

/// A module, as (crate, path within it): `("aether", "proxy::http::deliver")`.
type Module = (String, String);

/// Every non-test `.rs` file under `dir`.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut all = Vec::new();
    tree::walk(dir, &mut all);
    out.extend(all.into_iter().filter(|p| !tree::is_test_file(p)));
}

/// The module a file defines: `proxy/http/mod.rs` -> `proxy::http`; `lib.rs`, `main.rs` -> ``.
fn module_of(rel: &Path) -> String {
    let text = rel.to_string_lossy();
    let text = text.strip_suffix(".rs").unwrap_or(&text);
    let text = text.strip_suffix("/mod").unwrap_or(text);
    if text == "lib" || text == "main" {
        return String::new();
    }
    text.replace('/', "::")
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>().is_ok_and(|m| match &m {
                syn::Meta::Path(p) => p.is_ident("test"),
                syn::Meta::List(l) if l.path.is_ident("all") => {
                    l.tokens.to_string().contains("test")
                }
                _ => false,
            })
    })
}

/// Every path a file names, as segments, with the module (inline ones included) it is named from.
struct Names {
    module: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>)>,
}

impl Names {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.found.push((self.module.clone(), full));
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.found.push((self.module.clone(), full));
            }
            syn::UseTree::Glob(_) => self.found.push((self.module.clone(), prefix.clone())),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        match item {
            syn::Item::Use(u) => self.use_tree(&mut Vec::new(), &u.tree),
            syn::Item::Mod(m) if m.content.is_some() => {
                self.module.push(m.ident.to_string());
                visit::visit_item(self, item);
                self.module.pop();
            }
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 {
            self.found.push((self.module.clone(), segs));
        }
        visit::visit_path(self, path);
    }
}

/// The module graph: each file's module and the modules it names.
struct Graph {
    /// Every module that is a file, per crate.
    modules: BTreeSet<Module>,
    arrows: BTreeMap<Module, BTreeSet<Module>>,
}

fn split(module: &str) -> Vec<String> {
    module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The longest file module of `krate` that `path` (absolute, within the crate) starts with.
fn target(modules: &BTreeSet<Module>, krate: &str, path: &[String]) -> Option<Module> {
    (1..=path.len()).rev().find_map(|n| {
        let m = (krate.to_owned(), path[..n].join("::"));
        modules.contains(&m).then_some(m)
    })
}

fn graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    for (krate, dir) in CRATES {
        let mut found = Vec::new();
        walk(&root.join(dir), &mut found);
        for path in found {
            let rel = path
                .strip_prefix(root.join(dir))
                .expect("walked from the root");
            files.push(((*krate).to_owned(), module_of(rel), path));
        }
    }
    let modules: BTreeSet<Module> = files
        .iter()
        .map(|(k, m, _)| (k.clone(), m.clone()))
        .collect();
    let mut arrows: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (krate, module, path) in &files {
        let src = std::fs::read_to_string(path).expect("a source file reads");
        let parsed = syn::parse_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut names = Names {
            module: split(module),
            found: Vec::new(),
        };
        names.visit_file(&parsed);
        let from = (krate.clone(), module.clone());
        for (at, segs) in names.found {
            let (to_crate, abs) = match segs[0].as_str() {
                "crate" => (krate.clone(), segs[1..].to_vec()),
                "self" | "super" => {
                    let mut abs = at.clone();
                    let mut rest = &segs[..];
                    while let Some(s) = rest.first() {
                        match s.as_str() {
                            "self" => {}
                            "super" => {
                                abs.pop();
                            }
                            _ => break,
                        }
                        rest = &rest[1..];
                    }
                    abs.extend(rest.iter().cloned());
                    (krate.clone(), abs)
                }
                "aether" | "aether_core" | "aether_lab" => (segs[0].clone(), segs[1..].to_vec()),
                _ => continue,
            };
            if let Some(to) = target(&modules, &to_crate, &abs) {
                arrows.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    Graph { modules, arrows }
}

/// Whether one module is the other's ancestor (or the same).
fn related(a: &Module, b: &Module) -> bool {
    let within = |inner: &str, outer: &str| {
        outer.is_empty() || inner == outer || inner.starts_with(&format!("{outer}::"))
    };
    a.0 == b.0 && (within(&a.1, &b.1) || within(&b.1, &a.1))
}

fn show(m: &Module) -> String {
    format!("{}::{}", m.0, m.1)
}

/// The circles: strongly connected groups of more than one module (Tarjan's algorithm), over the
/// arrows between unrelated modules.
fn circles(g: &Graph) -> Vec<Vec<Module>> {
    struct State<'g> {
        g: &'g Graph,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on: BTreeSet<&'g Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.arrows.get(v).into_iter().flatten() {
            if related(v, w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for m in &g.modules {
        if !s.index.contains_key(m) {
            visit(&mut s, m);
        }
    }
    s.out
}

/// The arrows that point the wrong way (module docs).
fn wrong_way(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, tos) in &g.arrows {
        for to in tos {
            let top = |m: &Module| m.1.split("::").next().unwrap_or_default().to_owned();
            let into_node = to.0 == "aether" && top(to) == "node";
            if from.0 == "aether" && into_node && top(from) != "node" && !from.1.is_empty() {
                out.push(format!(
                    "{} names {}: a part of the daemon reaches up into the node that runs it",
                    show(from),
                    show(to)
                ));
            }
            if from.0 == "aether_lab" && to.0 == "aether" && top(to) == "proxy" {
                out.push(format!(
                    "{} names {}: the lab tests the proxy from outside (wire constants are aether-core's)",
                    show(from),
                    show(to)
                ));
            }
        }
    }
    out
}

#[test]
fn no_module_circle_and_no_wrong_way_arrow() {
    let g = graph(Path::new(env!("CARGO_MANIFEST_DIR")));
    let n: usize = g.arrows.values().map(BTreeSet::len).sum();
    assert!(
        g.modules.len() > 150 && n > 400,
        "the reading found {} modules and {n} arrows: too few, the walk is broken",
        g.modules.len()
    );
    let circles: Vec<String> = circles(&g)
        .iter()
        .map(|c| c.iter().map(show).collect::<Vec<_>>().join(" <-> "))
        .collect();
    let wrong = wrong_way(&g);
    assert!(
        circles.is_empty() && wrong.is_empty(),
        "circles:\n  {}\nwrong-way arrows:\n  {}",
        circles.join("\n  "),
        wrong.join("\n  ")
    );
    eprintln!(
        "arrows: {} modules, {n} arrows between them, no circle, none the wrong way",
        g.modules.len()
    );
}

// === The reading against scratch graphs: each shape it must refuse ===

fn scratch(arrows: &[(&str, &str, &str, &str)]) -> Graph {
    let mut g = Graph {
        modules: BTreeSet::new(),
        arrows: BTreeMap::new(),
    };
    for (fc, fm, tc, tm) in arrows {
        let from = ((*fc).to_owned(), (*fm).to_owned());
        let to = ((*tc).to_owned(), (*tm).to_owned());
        g.modules.insert(from.clone());
        g.modules.insert(to.clone());
        g.arrows.entry(from).or_default().insert(to);
    }
    g
}

#[test]
fn a_circle_of_two_or_three_is_found_and_a_parent_child_pair_is_not() {
    let two = scratch(&[
        ("aether", "model::filters", "aether", "model::route_match"),
        ("aether", "model::route_match", "aether", "model::filters"),
    ]);
    assert_eq!(circles(&two).len(), 1);
    let three = scratch(&[
        ("aether", "a", "aether", "b"),
        ("aether", "b", "aether", "c"),
        ("aether", "c", "aether", "a"),
    ]);
    assert_eq!(circles(&three)[0].len(), 3);
    let family = scratch(&[
        ("aether", "proxy", "aether", "proxy::http"),
        ("aether", "proxy::http", "aether", "proxy"),
    ]);
    assert!(circles(&family).is_empty());
    let line = scratch(&[
        ("aether", "a", "aether", "b"),
        ("aether", "b", "aether", "c"),
    ]);
    assert!(circles(&line).is_empty());
}

#[test]
fn a_part_naming_the_node_or_the_lab_naming_the_proxy_is_wrong_way() {
    let g = scratch(&[
        ("aether", "registrar", "aether", "node::stats"),
        ("aether", "log_filter", "aether", "node::config"),
        ("aether_lab", "legs::extra", "aether", "proxy"),
        ("aether", "node::admin", "aether", "node::stats"),
        ("aether_lab", "demo", "aether", "node::config"),
        ("aether_lab", "legs::rules", "aether_core", "proxy::sniff"),
    ]);
    let wrong = wrong_way(&g);
    assert_eq!(wrong.len(), 3, "{wrong:#?}");
}

#[test]
fn paths_resolve_from_the_module_they_are_written_in() {
    let dir = std::env::temp_dir().join(format!("aether-arrows-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a; pub mod b;").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "pub mod inner; use super::b::Thing; mod nested { use super::super::b; }",
    )
    .unwrap();
    std::fs::write(src.join("a/inner.rs"), "use crate::b; use super::Parent;").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "#[cfg(test)] mod tests { use crate::a::X; } fn f() { let _ = self::g(); }",
    )
    .unwrap();
    let mut files = Vec::new();
    walk(&src, &mut files);
    let modules: BTreeSet<Module> = files
        .iter()
        .map(|p| {
            (
                "aether".to_owned(),
                module_of(p.strip_prefix(&src).unwrap()),
            )
        })
        .collect();
    assert!(modules.contains(&("aether".to_owned(), "a::inner".to_owned())));
    let a_b = target(&modules, "aether", &split("b::Thing"));
    assert_eq!(a_b, Some(("aether".to_owned(), "b".to_owned())));
    std::fs::remove_dir_all(&dir).unwrap();
}

// === How long a function of the daemon may be (issue #38) ===

/// The most lines a function of the daemon may span, from its `fn` to its closing brace: past it,
/// the function does several things that want names of their own.
const MAX_FN_LINES: usize = 150;

/// The functions of one file, each as (its name with its enclosing type or module, its first
/// line, its length in lines).
#[derive(Default)]
struct Lengths {
    within: Vec<String>,
    found: Vec<(String, usize, usize)>,
}

impl Lengths {
    fn record(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        let start = fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let mut path = self.within.clone();
        path.push(name.to_string());
        self.found.push((path.join("::"), start, end + 1 - start));
    }

    /// `f` inside `name` (a module or an impl's type).
    fn within(&mut self, name: String, f: impl FnOnce(&mut Self)) {
        self.within.push(name);
        f(self);
        self.within.pop();
    }
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig.ident, &f.sig.fn_token, &f.block);
        self.within(f.sig.ident.to_string(), |s| visit::visit_item_fn(s, f));
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig.ident, &f.sig.fn_token, &f.block);
        self.within(f.sig.ident.to_string(), |s| visit::visit_impl_item_fn(s, f));
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig.ident, &f.sig.fn_token, block);
        }
        self.within(f.sig.ident.to_string(), |s| {
            visit::visit_trait_item_fn(s, f)
        });
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        self.within(name.unwrap_or_else(|| "impl".to_owned()), |s| {
            visit::visit_item_impl(s, i);
        });
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.within(t.ident.to_string(), |s| visit::visit_item_trait(s, t));
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.within(m.ident.to_string(), |s| visit::visit_item_mod(s, m));
    }
}

/// The functions of `src` (the text of `file`) longer than [`MAX_FN_LINES`], as
/// `file:line name: N lines`, and how many functions it has.
fn too_long(file: &str, src: &str) -> (Vec<String>, usize) {
    let parsed = syn::parse_file(src).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut lengths = Lengths::default();
    lengths.visit_file(&parsed);
    let long = lengths
        .found
        .iter()
        .filter(|(_, _, lines)| *lines > MAX_FN_LINES)
        .map(|(name, line, lines)| format!("{file}:{line} {name}: {lines} lines"))
        .collect();
    (long, lengths.found.len())
}

#[test]
fn no_function_of_the_daemon_is_over_150_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    tree::walk(&root.join("src"), &mut files);
    files.sort();
    let (mut long, mut count) = (Vec::new(), 0);
    for path in &files {
        let rel = path.strip_prefix(root).expect("walked from the root");
        let src = std::fs::read_to_string(path).expect("a source file reads");
        let (found, n) = too_long(&rel.to_string_lossy(), &src);
        long.extend(found);
        count += n;
    }
    assert!(
        files.len() > 100 && count > 1000,
        "the reading found {} files and {count} functions: too few, the walk is broken",
        files.len()
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split each into parts named for what they do):\n  {}",
        long.join("\n  ")
    );
    eprintln!(
        "function lengths: {count} functions in {} files, none over {MAX_FN_LINES} lines",
        files.len()
    );
}

#[test]
fn a_function_of_151_lines_is_found_wherever_it_is_and_one_of_150_is_not() {
    let body = |lines: usize| "    let _ = 0;\n".repeat(lines - 2);
    let src = format!(
        "/// Doc lines are not counted.\n#[inline]\nfn fits() {{\n{}}}\n\
         fn long() {{\n{}}}\n\
         impl Thing {{\n    pub async fn method(&self) {{\n{}}}\n}}\n\
         trait Shape {{\n    fn default_body() {{\n{}}}\n    fn no_body();\n}}\n\
         #[cfg(test)]\nmod tests {{\n    #[test]\n    fn a_test() {{\n        fn nested() {{\n{}}}\n    }}\n}}\n",
        body(150),
        body(151),
        body(151),
        body(151),
        body(151),
    );
    let (long, count) = too_long("src/scratch.rs", &src);
    assert_eq!(count, 6, "{long:#?}");
    // `fits` (150 lines, line 3) is not there; a test holding a long function is long too.
    assert_eq!(
        long,
        [
            "src/scratch.rs:153 long: 151 lines",
            "src/scratch.rs:305 Thing::method: 151 lines",
            "src/scratch.rs:458 Shape::default_body: 151 lines",
            "src/scratch.rs:614 tests::a_test: 153 lines",
            "src/scratch.rs:615 tests::a_test::nested: 151 lines",
        ]
    );
}
