//! What `aether debug services` and `aether debug routes` show, computed from one published
//! model and the snapshot it was compiled from (pure: no IO, no clock).
//!
//! The daemon serves these as JSON on its admin socket, and `/config_dump` carries them with
//! the snapshot and the compile context, so that `aether explain --config-dump` can compile
//! the same model again offline.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::model::attach::{Condition, describe_parent};
use crate::model::snapshot::{ParentRef, ProtocolValue};
use crate::model::{Model, NodeContext, Snapshot};

/// One mesh service as the model holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// Its namespace.
    pub namespace: String,
    /// Its name (the ServiceAccount).
    pub name: String,
    /// The ClusterIPs of the Service of that name, when there is one.
    pub cluster_ips: Vec<IpAddr>,
    /// Whether that Service is the generated one (`aether.io/mesh-service`).
    pub generated: bool,
    /// Each port the model serves, with its class and the votes behind it.
    pub ports: Vec<PortView>,
    /// The registry rows: one per pod.
    pub endpoints: Vec<EndpointView>,
    /// Routes with a parentRef naming this service.
    pub routes: Vec<String>,
    /// Its service-level filters, `<namespace>/<name>: <what it does>`; a MeshFilter the
    /// source could not read says so and what it refuses (issue #35 item 1).
    #[serde(default)]
    pub filters: Vec<String>,
}

/// One port of a mesh service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortView {
    /// The port.
    pub port: u16,
    /// The class the model serves it as: `http`, `tcp` or `udp`.
    pub class: String,
    /// The rows' votes for each protocol (spec/model.md §6.1).
    pub votes: BTreeMap<String, u32>,
    /// When the port is kept with no row declaring it (spec/model.md §10): since when, in
    /// milliseconds of the daemon's clock.
    pub retained_since_ms: Option<u64>,
}

/// One registry row of a mesh service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    /// The pod, when known.
    pub pod: Option<String>,
    /// Its address.
    pub address: IpAddr,
    /// Its node, when known.
    pub node: Option<String>,
    /// Ready (spec/model.md §3.5): only ready rows receive traffic.
    pub ready: bool,
    /// The ports it declares.
    pub ports: Vec<u32>,
}

/// One route and the status this node computes for each of its parents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteView {
    /// `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute` or `UDPRoute`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its parentRefs, as written (`<ns>/<name>[:port][#section]`).
    pub parents: Vec<String>,
    /// Per parent, the conditions (`Accepted`, `ResolvedRefs`, ...): a `False` one's message
    /// says why (an invalid backend reference, a port the parent does not declare).
    pub status: Vec<ParentStatus>,
}

/// The conditions of one parent of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentStatus {
    /// The parent.
    pub parent: String,
    /// Its conditions, in a fixed order.
    pub conditions: Vec<ConditionView>,
}

/// One status condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionView {
    /// Its type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

impl From<&Condition> for ConditionView {
    fn from(c: &Condition) -> Self {
        Self {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        }
    }
}

/// Every route of the snapshot, in (kind, namespace, name) order.
fn routes_of(snapshot: &Snapshot) -> Vec<(String, &str, &str, &[ParentRef])> {
    let mut out: Vec<(String, &str, &str, &[ParentRef])> = Vec::new();
    for r in &snapshot.http_routes {
        let kind = match r.kind {
            crate::model::snapshot::HttpRouteKind::Http => "HTTPRoute",
            crate::model::snapshot::HttpRouteKind::Grpc => "GRPCRoute",
        };
        out.push((kind.into(), &r.namespace, &r.name, &r.parents));
    }
    for (kind, routes) in [
        ("TLSRoute", &snapshot.tls_routes),
        ("TCPRoute", &snapshot.tcp_routes),
        ("UDPRoute", &snapshot.udp_routes),
    ] {
        for r in routes {
            out.push((kind.into(), &r.namespace, &r.name, &r.parents));
        }
    }
    out.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
    out
}

/// Every route the node holds, with the status its model computes.
pub fn routes(snapshot: &Snapshot, model: &Model) -> Vec<RouteView> {
    routes_of(snapshot)
        .into_iter()
        .map(|(kind, ns, name, parents)| {
            let status = model
                .route_statuses()
                .filter(|s| s.kind == kind && s.namespace == ns && s.name == name)
                .map(|s| ParentStatus {
                    parent: s.parent.clone(),
                    conditions: s.conditions.iter().map(ConditionView::from).collect(),
                })
                .collect();
            RouteView {
                parents: parents.iter().map(|p| describe_parent(ns, p)).collect(),
                kind,
                namespace: ns.to_owned(),
                name: name.to_owned(),
                status,
            }
        })
        .collect()
}

/// The mesh services the model holds (those named `name` only, when given: `<name>` or
/// `<namespace>/<name>`), in (namespace, name) order.
pub fn services(snapshot: &Snapshot, model: &Model, name: Option<&str>) -> Vec<ServiceView> {
    let wanted = |ns: &str, svc: &str| match name.map(|n| n.split_once('/')) {
        None => true,
        Some(Some((n, s))) => n == ns && s == svc,
        Some(None) => name == Some(svc),
    };
    let routes = routes_of(snapshot);
    model
        .every_class()
        .filter(|(k, _)| wanted(&k.namespace, &k.name))
        .map(|(key, classes)| {
            let (ns, svc) = (&*key.namespace, &*key.name);
            let rows: Vec<_> = snapshot
                .rows
                .iter()
                .filter(|r| r.namespace == ns && r.service == svc)
                .collect();
            let service = snapshot
                .services
                .iter()
                .find(|s| s.namespace == ns && s.name == svc);
            let ports = classes
                .iter()
                .map(|(&port, class)| {
                    let mut votes: BTreeMap<String, u32> = BTreeMap::new();
                    for row in &rows {
                        if let Some(ProtocolValue::Known(p)) = row
                            .port_protocols
                            .as_ref()
                            .and_then(|m| m.get(&u32::from(port)))
                        {
                            *votes.entry(p.as_str().to_owned()).or_default() += 1;
                        }
                    }
                    PortView {
                        port,
                        class: class.as_str().to_owned(),
                        votes,
                        retained_since_ms: snapshot
                            .retained
                            .iter()
                            .find(|r| r.namespace == ns && r.service == svc && r.port == port)
                            .map(|r| r.since_ms),
                    }
                })
                .collect();
            ServiceView {
                namespace: ns.to_owned(),
                name: svc.to_owned(),
                cluster_ips: service.map(|s| s.cluster_ips.clone()).unwrap_or_default(),
                generated: service.is_some_and(|s| s.generated),
                ports,
                endpoints: rows
                    .iter()
                    .map(|r| EndpointView {
                        pod: r.pod.clone(),
                        address: r.address,
                        node: r.node.clone(),
                        ready: r.ready,
                        ports: r.ports.clone(),
                    })
                    .collect(),
                routes: routes
                    .iter()
                    .filter(|(_, rns, _, parents)| {
                        parents.iter().any(|p| {
                            p.target.kind == "Service"
                                && p.target.name == svc
                                && p.target.namespace.as_deref().unwrap_or(rns) == ns
                        })
                    })
                    .map(|(kind, rns, rname, _)| format!("{kind} {rns}/{rname}"))
                    .collect(),
                filters: model
                    .filters_of(key)
                    .iter()
                    .map(|f| format!("{}: {}", f.name, crate::resolve::describe_filter(&f.config)))
                    .collect(),
            }
        })
        .collect()
}

/// What a config dump must carry for `aether explain --config-dump` to compile the served
/// model again: the snapshot (retained entries included) and the compile context (its clock
/// reading included).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompileInputs {
    /// The generation of the model they gave.
    pub generation: u64,
    /// The compile context.
    pub context: NodeContext,
    /// The snapshot.
    pub snapshot: Snapshot,
}

/// The compile inputs of a config dump (its `compile` key), or why they cannot be read.
pub fn compile_inputs(dump: &serde_json::Value) -> Result<CompileInputs, String> {
    let inputs = dump
        .get("compile")
        .ok_or("no `compile` key: not an `aether debug config-dump` document")?;
    serde_json::from_value(inputs.clone()).map_err(|e| format!("its `compile` key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compile;

    fn fixture() -> (Snapshot, Model) {
        let snapshot = crate::test_util::mp_fixture();
        let model = compile(&snapshot, &NodeContext::default());
        (snapshot, model)
    }

    #[test]
    fn a_service_shows_each_port_class_with_its_votes_rows_and_routes() {
        let (snapshot, model) = fixture();
        let all = services(&snapshot, &model, None);
        assert!(all.len() >= 8, "{}", all.len());
        let multi = services(&snapshot, &model, Some("mp/mp-multi"));
        assert_eq!(multi.len(), 1);
        let multi = &multi[0];
        assert!(multi.generated);
        assert_eq!(multi.cluster_ips.len(), 1);
        assert!(!multi.endpoints.is_empty());
        let rows = u32::try_from(multi.endpoints.len()).unwrap();
        for p in &multi.ports {
            assert_eq!(
                p.votes.get(&p.class).copied(),
                Some(rows),
                "every row votes for the class of {}: {p:?}",
                p.port
            );
        }
        let udp = &services(&snapshot, &model, Some("mp/mp-udp"))[0];
        assert!(
            udp.routes.iter().any(|r| r.starts_with("UDPRoute mp/")),
            "{udp:?}"
        );
        assert_eq!(
            services(&snapshot, &model, Some("mp-multi")),
            std::slice::from_ref(multi)
        );
        assert!(services(&snapshot, &model, Some("mp/no-such")).is_empty());
    }

    #[test]
    fn routes_carry_their_parents_and_the_computed_conditions() {
        let (snapshot, model) = fixture();
        let routes = routes(&snapshot, &model);
        assert!(!routes.is_empty());
        for r in &routes {
            assert!(!r.parents.is_empty(), "{r:?}");
            for s in &r.status {
                assert!(r.parents.contains(&s.parent), "{r:?}");
                assert!(s.conditions.iter().any(|c| c.type_ == "Accepted"), "{r:?}");
            }
        }
    }

    #[test]
    fn compile_inputs_round_trip_through_json_and_compile_the_same_model() {
        let (snapshot, model) = fixture();
        let inputs = CompileInputs {
            generation: 3,
            context: model.context.clone(),
            snapshot,
        };
        let dump = serde_json::json!({ "compile": inputs });
        let text = serde_json::to_string(&dump).unwrap();
        let back = compile_inputs(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back.generation, 3);
        assert_eq!(compile(&back.snapshot, &back.context), model);
        let err = compile_inputs(&serde_json::json!({"node": "a"})).unwrap_err();
        assert!(err.contains("not an `aether debug config-dump`"), "{err}");
    }
}
