//! A snapshot by independent parts, and their models merged into one.
//!
//! The compiler reads across objects only through names, addresses and references: a row and a
//! Service meet on their (namespace, name), a row, a pod, a slice and a ClusterIP on an address,
//! a route on the Services and filters it names, a MeshFilter on the Services it targets. Objects
//! that no such link joins, directly or through others, never see each other: each
//! [component](Partition) of the snapshot compiles alone, and [`merge`] of the parts' models is
//! the model [`compile`](crate::model::compile()) gives for the whole (a property test holds the
//! two equal). An incremental compile stands on it: a change recompiles the components it
//! touches and reuses the others.
//!
//! The links are drawn wide on purpose: a link too many only makes a component larger, a link
//! missing would make a part's model wrong.

use crate::prelude::*;

use std::collections::HashMap;
use std::net::IpAddr;

use crate::model::snapshot::{
    EndpointSlice, FilterConfig, HttpFilter, HttpRoute, L4Route, ObjectRef, Snapshot,
};
use crate::model::table::{Sorted, Table};
use crate::model::{Model, NodeContext, compile};

/// What the compiler joins objects on.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Link<'s> {
    /// A Service, a mesh service (a row's ServiceAccount) or a retained port of that name.
    Service(&'s str, &'s str),
    /// A MeshFilter by (namespace, name).
    Filter(&'s str, &'s str),
    /// A pod by (namespace, name).
    Pod(&'s str, &'s str),
    /// A pod IP, a slice endpoint's address, a ClusterIP.
    Address(IpAddr),
    /// Any other object a route names (a Gateway parent), and an EndpointSlice by its own
    /// name: (group, kind, namespace, name).
    Other(&'s str, &'s str, &'s str, &'s str),
    /// A route itself (kind, namespace, name), so that a route naming nothing is still placed.
    Route(u8, &'s str, &'s str),
}

/// Union-find over the links met so far.
struct Joined<'s> {
    ids: HashMap<Link<'s>, u32>,
    parent: Vec<u32>,
}

impl<'s> Joined<'s> {
    fn id(&mut self, link: Link<'s>) -> u32 {
        let next = u32::try_from(self.parent.len()).expect("fewer than 2^32 links");
        let id = *self.ids.entry(link).or_insert(next);
        if id == next {
            self.parent.push(id);
        }
        id
    }

    fn root(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            // Path halving.
            let grand = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = grand;
            x = grand;
        }
        x
    }

    /// Joins every link of one object; returns the object's node.
    fn object(&mut self, links: impl IntoIterator<Item = Link<'s>>) -> u32 {
        let mut links = links.into_iter();
        let first = links.next().expect("every object has a link of its own");
        let first = self.id(first);
        for l in links {
            let id = self.id(l);
            let (a, b) = (self.root(first), self.root(id));
            if a != b {
                // The smaller root wins, so that the result does not depend on the join order.
                let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                self.parent[hi as usize] = lo;
            }
        }
        first
    }
}

/// Calls `each!(field)` for every list of a snapshot that [`partition`] places.
macro_rules! each_kind {
    ($each:ident) => {
        $each!(rows);
        $each!(refused_pods);
        $each!(pods);
        $each!(services);
        $each!(endpoint_slices);
        $each!(http_routes);
        $each!(tls_routes);
        $each!(tcp_routes);
        $each!(udp_routes);
        $each!(mesh_filters);
        $each!(retained);
    };
}

/// The component of every object of a snapshot, by kind, in the snapshot's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// How many components there are; ids run from 0.
    pub count: u32,
    rows: Vec<u32>,
    refused_pods: Vec<u32>,
    pods: Vec<u32>,
    services: Vec<u32>,
    endpoint_slices: Vec<u32>,
    http_routes: Vec<u32>,
    tls_routes: Vec<u32>,
    tcp_routes: Vec<u32>,
    udp_routes: Vec<u32>,
    mesh_filters: Vec<u32>,
    retained: Vec<u32>,
}

impl Partition {
    /// The component of the snapshot's row `i`.
    pub fn row(&self, i: usize) -> u32 {
        self.rows[i]
    }
}

/// The service (or other object) a reference names, from an object in `ns`.
fn target<'s>(ns: &'s str, t: &'s ObjectRef) -> Link<'s> {
    let tns = t.namespace.as_deref().unwrap_or(ns);
    if t.kind == "Service" {
        Link::Service(tns, &t.name)
    } else {
        Link::Other(&t.group, &t.kind, tns, &t.name)
    }
}

/// The links of a filter a route rule or backend carries.
fn filter_links<'s>(ns: &'s str, f: &'s HttpFilter) -> Option<Link<'s>> {
    match f {
        HttpFilter::RequestMirror(m) => Some(target(ns, &m.backend)),
        HttpFilter::ExtensionRef(r) => {
            Some(Link::Filter(r.namespace.as_deref().unwrap_or(ns), &r.name))
        }
        _ => None,
    }
}

pub(crate) fn http_route_links(r: &HttpRoute) -> Vec<Link<'_>> {
    let ns = r.namespace.as_str();
    let mut links = vec![Link::Route(0, ns, &r.name)];
    links.extend(r.parents.iter().map(|p| target(ns, &p.target)));
    for rule in &r.rules {
        links.extend(rule.filters.iter().filter_map(|f| filter_links(ns, f)));
        for b in &rule.backends {
            links.push(target(ns, &b.target));
            links.extend(b.filters.iter().filter_map(|f| filter_links(ns, f)));
        }
    }
    links
}

pub(crate) fn l4_route_links(kind: u8, r: &L4Route) -> Vec<Link<'_>> {
    let ns = r.namespace.as_str();
    let mut links = vec![Link::Route(kind, ns, &r.name)];
    links.extend(r.parents.iter().map(|p| target(ns, &p.target)));
    for rule in &r.rules {
        links.extend(rule.backends.iter().map(|b| target(ns, &b.target)));
    }
    links
}

/// The links of an EndpointSlice: its Service, its own name (two slices of one name are one
/// part: a part is found again by its first object's name, `Compiled`), its addresses.
pub(crate) fn slice_links(e: &EndpointSlice) -> impl Iterator<Item = Link<'_>> {
    [
        Link::Service(&e.namespace, &e.service),
        Link::Other("discovery.k8s.io", "EndpointSlice", &e.namespace, &e.name),
    ]
    .into_iter()
    .chain(
        e.endpoints
            .iter()
            .flat_map(|ep| ep.addresses.iter().map(|&ip| Link::Address(ip))),
    )
}

/// The components of `s`. Cost: one hash lookup per link of every object.
pub fn partition(s: &Snapshot) -> Partition {
    // Sized for about two links an object (most have one of their own and an address), so
    // that the map does not rehash as it fills.
    let objects = s.rows.len()
        + s.refused_pods.len()
        + s.pods.len()
        + s.services.len()
        + s.endpoint_slices.len()
        + s.http_routes.len()
        + s.tls_routes.len()
        + s.tcp_routes.len()
        + s.udp_routes.len()
        + s.mesh_filters.len()
        + s.retained.len();
    let mut j = Joined {
        ids: HashMap::with_capacity(objects * 2),
        parent: Vec::with_capacity(objects * 2),
    };
    let rows: Vec<u32> = s
        .rows
        .iter()
        .map(|r| {
            j.object([
                Link::Service(&r.namespace, &r.service),
                Link::Address(r.address),
            ])
        })
        .collect();
    let refused_pods: Vec<u32> = s
        .refused_pods
        .iter()
        .map(|p| j.object([Link::Pod(&p.namespace, &p.name)]))
        .collect();
    let pods: Vec<u32> = s
        .pods
        .iter()
        .map(|p| {
            j.object(
                std::iter::once(Link::Pod(&p.namespace, &p.name))
                    .chain(p.ips.iter().map(|&ip| Link::Address(ip))),
            )
        })
        .collect();
    let services: Vec<u32> = s
        .services
        .iter()
        .map(|v| {
            j.object(
                std::iter::once(Link::Service(&v.namespace, &v.name))
                    .chain(v.cluster_ips.iter().map(|&ip| Link::Address(ip))),
            )
        })
        .collect();
    let endpoint_slices: Vec<u32> = s
        .endpoint_slices
        .iter()
        .map(|e| j.object(slice_links(e)))
        .collect();
    let http_routes: Vec<u32> = s
        .http_routes
        .iter()
        .map(|r| j.object(http_route_links(r)))
        .collect();
    let tls_routes: Vec<u32> = s
        .tls_routes
        .iter()
        .map(|r| j.object(l4_route_links(1, r)))
        .collect();
    let tcp_routes: Vec<u32> = s
        .tcp_routes
        .iter()
        .map(|r| j.object(l4_route_links(2, r)))
        .collect();
    let udp_routes: Vec<u32> = s
        .udp_routes
        .iter()
        .map(|r| j.object(l4_route_links(3, r)))
        .collect();
    let mesh_filters: Vec<u32> = s
        .mesh_filters
        .iter()
        .map(|f| {
            // A filter whose targets could not be read targets every Service and mesh service
            // of its namespace (the compiler's `mesh_filters`): it joins them all.
            let whole = matches!(&f.config, FilterConfig::Unreadable(u) if u.whole_namespace);
            let everything = whole.then(|| {
                s.services
                    .iter()
                    .filter(|v| v.namespace == f.namespace)
                    .map(|v| Link::Service(&v.namespace, &v.name))
                    .chain(
                        s.rows
                            .iter()
                            .filter(|r| r.namespace == f.namespace)
                            .map(|r| Link::Service(&r.namespace, &r.service)),
                    )
            });
            j.object(
                std::iter::once(Link::Filter(&f.namespace, &f.name))
                    .chain(f.target_refs.iter().map(|t| Link::Service(&f.namespace, t)))
                    .chain(everything.into_iter().flatten()),
            )
        })
        .collect();
    let retained: Vec<u32> = s
        .retained
        .iter()
        .map(|r| j.object([Link::Service(&r.namespace, &r.service)]))
        .collect();

    // Dense component ids, numbered in the order their first object appears.
    let mut dense: HashMap<u32, u32> = HashMap::new();
    let mut number = |j: &mut Joined<'_>, nodes: Vec<u32>| -> Vec<u32> {
        nodes
            .into_iter()
            .map(|n| {
                let root = j.root(n);
                let next = u32::try_from(dense.len()).expect("fewer than 2^32 components");
                *dense.entry(root).or_insert(next)
            })
            .collect()
    };
    let mut p = Partition {
        count: 0,
        rows: number(&mut j, rows),
        refused_pods: number(&mut j, refused_pods),
        pods: number(&mut j, pods),
        services: number(&mut j, services),
        endpoint_slices: number(&mut j, endpoint_slices),
        http_routes: number(&mut j, http_routes),
        tls_routes: number(&mut j, tls_routes),
        tcp_routes: number(&mut j, tcp_routes),
        udp_routes: number(&mut j, udp_routes),
        mesh_filters: number(&mut j, mesh_filters),
        retained: number(&mut j, retained),
    };
    p.count = u32::try_from(dense.len()).expect("fewer than 2^32 components");
    p
}

/// The objects of `s` whose component `keep` accepts, in their order; the namespaces and the
/// ReferenceGrants (which the compiler does not read) are copied whole.
pub fn restrict(s: &Snapshot, p: &Partition, keep: impl Fn(u32) -> bool) -> Snapshot {
    let mut out = Snapshot {
        namespaces: s.namespaces.clone(),
        reference_grants: s.reference_grants.clone(),
        ..Snapshot::default()
    };
    macro_rules! copy {
        ($kind:ident) => {
            out.$kind = s
                .$kind
                .iter()
                .zip(&p.$kind)
                .filter(|(_, c)| keep(**c))
                .map(|(x, _)| x.clone())
                .collect();
        };
    }
    each_kind!(copy);
    out
}

/// One model from the models of disjoint components, each compiled with `ctx`: equal to the
/// model of their union. The tables' entries are shared with the parts (their `Arc`s), not
/// copied; the port classes are cloned.
pub fn merge<'m>(ctx: &NodeContext, parts: impl IntoIterator<Item = &'m Model>) -> Model {
    let parts: Vec<&Model> = parts.into_iter().collect();
    // Every table cut for its final size first: a table cut again copies all it holds.
    let total = |f: fn(&Model) -> usize| parts.iter().map(|p| f(p)).sum::<usize>();
    let mut m = Model {
        context: ctx.clone(),
        names: Table::default(),
        cluster_ips: Table::with_capacity(total(|p| p.cluster_ips.len())),
        pod_ips: Table::with_capacity(total(|p| p.pod_ips.len())),
        pods: Sorted::default(),
        l4: Table::with_capacity(total(|p| p.l4.len())),
        service_filters: Table::default(),
        classes: Table::with_capacity(total(|p| p.classes.len())),
        statuses: Sorted::default(),
        diagnostics: Sorted::default(),
    };
    let mut pods = Vec::with_capacity(total(|p| p.pods.len()));
    let mut statuses = Vec::with_capacity(total(|p| p.statuses.len()));
    let mut diagnostics = Vec::with_capacity(total(|p| p.diagnostics.len()));
    for part in parts {
        for (ns, names) in &part.names {
            match m.names.get_mut(ns) {
                Some(into) => into.extend(names.iter().map(|(n, e)| (n.clone(), e.clone()))),
                None => {
                    m.names.insert(ns.clone(), names.clone());
                }
            }
        }
        m.cluster_ips
            .extend(part.cluster_ips.iter().map(|(k, v)| (*k, v.clone())));
        m.pod_ips
            .extend(part.pod_ips.iter().map(|(k, v)| (*k, v.clone())));
        pods.extend(part.pods.iter().cloned());
        m.l4.extend(part.l4.iter().map(|(k, v)| (*k, v.clone())));
        m.service_filters.extend(
            part.service_filters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        m.classes
            .extend(part.classes.iter().map(|(k, v)| (k.clone(), v.clone())));
        statuses.extend(part.statuses.iter().cloned());
        // Two parts can report one problem of a name they both read (a namespace's, for
        // instance): the list holds it once.
        diagnostics.extend(part.diagnostics.iter().cloned());
    }
    // The parts' pods are disjoint (a pod's name links its objects into one component).
    m.pods = Sorted::from_vec(pods);
    m.statuses = Sorted::from_vec(statuses);
    m.diagnostics = Sorted::from_vec(diagnostics);
    m
}

/// The objects of one component, by kind: indices into the snapshot's lists, ascending.
#[derive(Default)]
struct Members {
    rows: Vec<usize>,
    refused_pods: Vec<usize>,
    pods: Vec<usize>,
    services: Vec<usize>,
    endpoint_slices: Vec<usize>,
    http_routes: Vec<usize>,
    tls_routes: Vec<usize>,
    tcp_routes: Vec<usize>,
    udp_routes: Vec<usize>,
    mesh_filters: Vec<usize>,
    retained: Vec<usize>,
}

/// One component as last compiled: its objects (to tell whether the next snapshot has the
/// same ones) and its model.
struct Part {
    objects: Snapshot,
    model: Model,
}

/// A component's first object, by kind, then (namespace, name) and the row's address: where
/// the next snapshot's component with the same first object looks for its old part.
type Representative = (u8, String, String, Option<IpAddr>);

/// The first object of `m`, in the order of [`each_kind!`].
fn representative(s: &Snapshot, m: &Members) -> Representative {
    let named = |kind: u8, ns: &str, name: &str| (kind, ns.to_owned(), name.to_owned(), None);
    if let Some(&i) = m.rows.first() {
        let r = &s.rows[i];
        return (0, r.namespace.clone(), r.service.clone(), Some(r.address));
    }
    if let Some(&i) = m.refused_pods.first() {
        return named(1, &s.refused_pods[i].namespace, &s.refused_pods[i].name);
    }
    if let Some(&i) = m.pods.first() {
        return named(2, &s.pods[i].namespace, &s.pods[i].name);
    }
    if let Some(&i) = m.services.first() {
        return named(3, &s.services[i].namespace, &s.services[i].name);
    }
    if let Some(&i) = m.endpoint_slices.first() {
        return named(
            4,
            &s.endpoint_slices[i].namespace,
            &s.endpoint_slices[i].name,
        );
    }
    if let Some(&i) = m.http_routes.first() {
        return named(5, &s.http_routes[i].namespace, &s.http_routes[i].name);
    }
    for (kind, routes, of) in [
        (6, &s.tls_routes, &m.tls_routes),
        (7, &s.tcp_routes, &m.tcp_routes),
        (8, &s.udp_routes, &m.udp_routes),
    ] {
        if let Some(&i) = of.first() {
            return named(kind, &routes[i].namespace, &routes[i].name);
        }
    }
    if let Some(&i) = m.mesh_filters.first() {
        return named(9, &s.mesh_filters[i].namespace, &s.mesh_filters[i].name);
    }
    match m.retained.first() {
        Some(&i) => named(10, &s.retained[i].namespace, &s.retained[i].service),
        None => named(11, "", ""),
    }
}

/// What [`Compiled::update`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Components compiled (new or changed).
    pub compiled: usize,
    /// Components whose model was reused.
    pub reused: usize,
}

/// A compile that keeps its components' models: the next snapshot compiles only the
/// components that are not, object for object, one it compiled before, and the model is the
/// merge of the parts. [`update`](Self::update) returns what `compile` would.
#[derive(Default)]
pub struct Compiled {
    /// The context the parts were compiled with.
    ctx: NodeContext,
    /// The parts by their first object.
    parts: HashMap<Representative, Part>,
    /// Parts whose first object another part's also is (none, as [`partition`] links objects
    /// of one name): merged, never reused.
    spilled: Vec<Part>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl Compiled {
    /// The model of `s` under `ctx`, reusing the parts of the last update that `s` holds
    /// unchanged. A part is compiled again when its objects changed, when the context changed
    /// (the clock alone: when the part holds retained ports, which expire by it).
    pub fn update(&mut self, s: &Snapshot, ctx: &NodeContext) -> (Model, UpdateStats) {
        let p = partition(s);
        let mut members: Vec<Members> = (0..p.count).map(|_| Members::default()).collect();
        macro_rules! gather {
            ($kind:ident) => {
                for (i, &c) in p.$kind.iter().enumerate() {
                    members[c as usize].$kind.push(i);
                }
            };
        }
        each_kind!(gather);

        let unclocked = |c: &NodeContext| NodeContext {
            now_ms: 0,
            ..c.clone()
        };
        let same_context = unclocked(ctx) == unclocked(&self.ctx);
        let clock_moved = ctx.now_ms != self.ctx.now_ms;
        let mut old = std::mem::take(&mut self.parts);
        self.spilled.clear();
        let mut stats = UpdateStats::default();
        self.parts.reserve(members.len());
        for m in &members {
            let rep = representative(s, m);
            let reused = old.remove(&rep).filter(|part| {
                same_context
                    && (!clock_moved || part.objects.retained.is_empty())
                    && same_objects(&part.objects, s, m)
            });
            let part = match reused {
                Some(part) => {
                    stats.reused += 1;
                    part
                }
                None => {
                    stats.compiled += 1;
                    let objects = pick(s, m);
                    let model = compile(&objects, ctx);
                    Part { objects, model }
                }
            };
            if let Some(twin) = self.parts.insert(rep, part) {
                self.spilled.push(twin);
            }
        }
        self.ctx = ctx.clone();
        let model = merge(
            ctx,
            self.parts.values().chain(&self.spilled).map(|p| &p.model),
        );
        (model, stats)
    }
}

/// Whether `part` holds exactly the objects `m` picks out of `s`, in order.
fn same_objects(part: &Snapshot, s: &Snapshot, m: &Members) -> bool {
    macro_rules! same {
        ($kind:ident) => {
            if part.$kind.len() != m.$kind.len()
                || !part
                    .$kind
                    .iter()
                    .zip(&m.$kind)
                    .all(|(a, &i)| *a == s.$kind[i])
            {
                return false;
            }
        };
    }
    each_kind!(same);
    true
}

/// The objects `m` picks out of `s`, with the namespaces and ReferenceGrants, as [`restrict`].
fn pick(s: &Snapshot, m: &Members) -> Snapshot {
    let mut out = Snapshot {
        namespaces: s.namespaces.clone(),
        reference_grants: s.reference_grants.clone(),
        ..Snapshot::default()
    };
    macro_rules! copy {
        ($kind:ident) => {
            out.$kind = m.$kind.iter().map(|&i| s.$kind[i].clone()).collect();
        };
    }
    each_kind!(copy);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::Row;
    use crate::model::synth;
    use std::sync::Arc;

    /// The component of the generated Service `ns/name`.
    fn of_service(s: &Snapshot, p: &Partition, ns: &str, name: &str) -> u32 {
        let i = s
            .services
            .iter()
            .position(|v| v.namespace == ns && v.name == name)
            .expect("the Service is in the snapshot");
        p.services[i]
    }

    #[test]
    fn each_service_of_the_scaled_registry_stands_alone_with_its_pods_and_route() {
        let s = synth::scaled(200);
        let p = partition(&s);
        assert_eq!(p.count, 200);
        // svc-5 has a route (every tenth service from the fifth): it is in svc-5's part, with
        // both of its pods and their rows.
        let c = of_service(&s, &p, "ns-5", "svc-5");
        let route = s
            .http_routes
            .iter()
            .position(|r| r.name == "svc-5-route")
            .expect("svc-5 has a route");
        assert_eq!(p.http_routes[route], c);
        let pods: Vec<u32> = s
            .pods
            .iter()
            .zip(&p.pods)
            .filter(|(x, _)| x.name.starts_with("svc-5-"))
            .map(|(_, &c)| c)
            .collect();
        assert_eq!(pods, vec![c, c]);
        assert_ne!(of_service(&s, &p, "ns-6", "svc-6"), c);
    }

    #[test]
    fn a_route_across_namespaces_and_a_shared_address_join_their_services() {
        let mut s = synth::scaled(40);
        let count = partition(&s).count;
        // A route in ns-1 whose backend is ns-2/svc-2: one part instead of two.
        let mut route = s.http_routes[0].clone();
        route.namespace = "ns-1".into();
        route.name = "across".into();
        route.parents[0].target.name = "svc-1".into();
        route.rules[0].backends[0].target.namespace = Some("ns-2".into());
        route.rules[0].backends[0].target.name = "svc-2".into();
        s.http_routes.push(route);
        let p = partition(&s);
        assert_eq!(p.count, count - 1);
        assert_eq!(
            of_service(&s, &p, "ns-1", "svc-1"),
            of_service(&s, &p, "ns-2", "svc-2")
        );
        // A row of svc-3 at svc-4's pod address (an IP reused while a pod terminates): one
        // part, since the pod-IP entry belongs to the first row in row order.
        let at = s
            .rows
            .iter()
            .find(|r| r.service == "svc-4")
            .expect("svc-4 has rows")
            .address;
        let mut row = s
            .rows
            .iter()
            .find(|r| r.service == "svc-3")
            .map(|r| Row::clone(r))
            .expect("svc-3 has rows");
        row.address = at;
        s.rows.push(Arc::new(row));
        let p = partition(&s);
        assert_eq!(p.count, count - 2);
        assert_eq!(
            of_service(&s, &p, "ns-3", "svc-3"),
            of_service(&s, &p, "ns-4", "svc-4")
        );
        // And the parts still compile to the whole.
        let ctx = NodeContext::default();
        let parts: Vec<Model> = (0..p.count)
            .map(|c| compile(&restrict(&s, &p, |x| x == c), &ctx))
            .collect();
        assert!(merge(&ctx, &parts) == compile(&s, &ctx));
    }

    #[test]
    fn an_unchanged_snapshot_reuses_every_part_and_a_new_context_none() {
        let s = synth::scaled(60);
        let ctx = NodeContext::default();
        let mut kept = Compiled::default();
        let (first, stats) = kept.update(&s, &ctx);
        assert_eq!((stats.compiled, stats.reused), (60, 0));
        let (again, stats) = kept.update(&s, &ctx);
        assert_eq!((stats.compiled, stats.reused), (0, 60));
        assert!(again == first);
        let other = NodeContext {
            trust_domain: "example.org".into(),
            ..ctx
        };
        let (model, stats) = kept.update(&s, &other);
        assert_eq!((stats.compiled, stats.reused), (60, 0));
        assert!(model == compile(&s, &other));
    }
}
