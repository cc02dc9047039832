//! `manifests`: the file registry (src/registry/file.rs `load_dir`): a directory of YAML
//! manifests a user writes, read into a snapshot, completed by the registrar, compiled into the
//! model, and made into the mesh DNS table, as the daemon does on every change.
//!
//! Each input is written as the one file `m.yaml` of a directory of this target's own.
//!
//! Properties, beyond "no panic":
//! - a file that is UTF-8 always loads (bad documents are problems, never a failed load), and
//!   one that is not is a read error;
//! - every problem can be displayed;
//! - loading and compiling are deterministic (the same file twice gives the same snapshot and
//!   an equal model).

use std::path::PathBuf;
use std::sync::OnceLock;

use aether::dns::DnsTable;
use aether::model::{NodeContext, compile, registrar};
use aether::registry::file::load_dir;

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "manifests",
    max_len: 8 * 1024,
    dict: &[
        b"---\n",
        b"\n---\n",
        b"apiVersion: v1\n",
        b"apiVersion: gateway.networking.k8s.io/v1\n",
        b"apiVersion: discovery.k8s.io/v1\n",
        b"apiVersion: mesh.aether.io/v1alpha1\n",
        b"kind: Pod\n",
        b"kind: Service\n",
        b"kind: HTTPRoute\n",
        b"kind: GRPCRoute\n",
        b"kind: TCPRoute\n",
        b"kind: EndpointSlice\n",
        b"kind: MeshFilter\n",
        b"kind: ReferenceGrant\n",
        b"metadata:\n  name: x\n  namespace: mp\n",
        b"spec:\n",
        b"  ports:\n  - port: 8080\n",
        b"    targetPort: http\n",
        b"  clusterIP: None\n",
        b"  selector:\n    app: x\n",
        b"  parentRefs:\n  - group: \"\"\n    kind: Service\n    name: mp-multi\n",
        b"  rules:\n  - matches:\n    - path:\n        type: RegularExpression\n        value: \"",
        b"    backendRefs:\n    - group: \"\"\n      kind: Service\n      name: mp-multi\n      port: 9090\n",
        b"status:\n  podIP: 10.244.0.7\n",
        b"endpoint.aether.io/ports: \"",
        b": ",
        b"- ",
        b"  ",
        b"&a ",
        b"*a",
        b"<<: *a\n",
        b"!!binary ",
        b"{}",
        b"[]",
        b"~",
        b"null",
        b"0x1F",
        b"1e9",
        b"-1",
        b"2147483648",
        b"\"\\u0000\"",
        b"\xef\xbb\xbf",
    ],
    run,
};

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fuzz-manifests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dir
    })
}

fn run(input: &[u8]) -> u64 {
    let dir = dir();
    std::fs::write(dir.join("m.yaml"), input).unwrap_or_else(|e| panic!("write: {e}"));
    // A file that does not read whole (not UTF-8, a document that does not parse) is skipped
    // whole and reported as a fault; the load itself never fails on a file's content.
    let loaded = load_dir(dir).unwrap_or_else(|e| panic!("a file's content failed the load: {e}"));
    if std::str::from_utf8(input).is_err() {
        assert!(
            !loaded.faults.is_empty(),
            "a file that is not UTF-8 loaded without a fault"
        );
        assert!(loaded.snapshot.pods.is_empty() && loaded.snapshot.services.is_empty());
        return outcome(&"not-utf8");
    }
    for p in &loaded.problems {
        let _ = p.to_string();
    }
    let again = load_dir(dir).unwrap_or_else(|e| panic!("the second load failed: {e}"));
    assert_eq!(loaded, again, "two loads of one file differ");

    let mut snapshot = loaded.snapshot;
    let report =
        registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().expect("a cidr"));
    let _ = format!("{report:?}");
    let ctx = NodeContext::default();
    let model = compile(&snapshot, &ctx);
    assert_eq!(
        model,
        compile(&snapshot, &ctx),
        "two compiles of one snapshot differ"
    );
    let dns = DnsTable::build(&snapshot, &ctx.domains, true);
    let mut issues: Vec<String> = loaded
        .problems
        .iter()
        .map(|p| {
            let s = p.issue.to_string();
            s.chars().take_while(|c| *c != '(' && *c != ':').collect()
        })
        .collect();
    issues.sort();
    issues.dedup();
    outcome(&(
        issues,
        snapshot.pods.len(),
        snapshot.services.len(),
        snapshot.http_routes.len(),
        model.diagnostics.len(),
        dns.len(),
    ))
}
