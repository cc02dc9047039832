//! Rendering a plan as text: the kube-proxy stand-in's nftables ruleset and the summary.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddrV4;

use crate::lab::plan::{LabPlan, MASQUERADE_MARK, key};
use aether_core::model::port::Transport;

impl LabPlan {
    /// The name of the kube-proxy stand-in's nftables table.
    pub fn kube_proxy_table(&self) -> String {
        format!("{}-kubeproxy", self.prefix)
    }

    /// The kube-proxy stand-in ruleset (the same in every node namespace), for `nft -f`.
    ///
    /// Per front port a chain picks one endpoint at random (`numgen random mod N vmap`) and
    /// jumps to that endpoint's chain, which DNATs; a Service without Ready endpoints gets no
    /// rule. The file first declares and deletes the table, so applying it twice replaces it.
    ///
    /// Hairpin traffic (a pod reaching its own Service and being chosen as the endpoint) is
    /// masqueraded as kube-proxy does it: the endpoint chain marks a packet whose source is that
    /// endpoint with [`MASQUERADE_MARK`], and the postrouting chain `masquerading` clears the
    /// bit and SNATs the packet to the node's bridge address. Without it the pod would get a
    /// packet from its own address (dropped as a martian) and could not answer through the node,
    /// where the DNAT is undone. Other clients keep their source address.
    pub fn render_kube_proxy(&self) -> String {
        let table = self.kube_proxy_table();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# kube-proxy stand-in of the aether lab (user Services only)."
        );
        let _ = writeln!(out, "table ip {table}");
        let _ = writeln!(out, "delete table ip {table}");
        let _ = writeln!(out, "table ip {table} {{");
        let mut endpoint_chains: BTreeSet<(SocketAddrV4, &'static str)> = BTreeSet::new();
        let mut dispatch = Vec::new();
        for rule in self.services.iter().filter(|r| !r.endpoints.is_empty()) {
            let proto = proto_word(rule.transport);
            let chain = format!(
                "svc-{}-{}-{}-{}",
                rule.namespace, rule.name, proto, rule.port
            );
            let _ = writeln!(out, "\tchain {chain} {{");
            let targets: Vec<String> = rule
                .endpoints
                .iter()
                .map(|ep| endpoint_chain(*ep, proto))
                .collect();
            if let [only] = targets.as_slice() {
                let _ = writeln!(out, "\t\tgoto {only}");
            } else {
                let arms: Vec<String> = targets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("{i} : goto {t}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "\t\tnumgen random mod {} vmap {{ {} }}",
                    targets.len(),
                    arms.join(", ")
                );
            }
            let _ = writeln!(out, "\t}}");
            for ep in &rule.endpoints {
                endpoint_chains.insert((*ep, proto));
            }
            dispatch.push(format!(
                "\t\tip daddr {} {proto} dport {} goto {chain}",
                rule.cluster_ip, rule.port
            ));
        }
        for (ep, proto) in &endpoint_chains {
            let _ = writeln!(out, "\tchain {} {{", endpoint_chain(*ep, proto));
            let _ = writeln!(out, "\t\tip saddr {} jump mark-for-masquerade", ep.ip());
            let _ = writeln!(out, "\t\tmeta l4proto {proto} dnat to {ep}");
            let _ = writeln!(out, "\t}}");
        }
        let mark = format!("{MASQUERADE_MARK:#010x}");
        let _ = writeln!(out, "\tchain mark-for-masquerade {{");
        let _ = writeln!(out, "\t\tmeta mark set meta mark | {mark}");
        let _ = writeln!(out, "\t}}");
        let _ = writeln!(out, "\tchain masquerading {{");
        let _ = writeln!(
            out,
            "\t\ttype nat hook postrouting priority 100; policy accept;"
        );
        let _ = writeln!(out, "\t\tmeta mark & {mark} == 0 return");
        let _ = writeln!(out, "\t\tmeta mark set meta mark ^ {mark}");
        let _ = writeln!(out, "\t\tmasquerade");
        let _ = writeln!(out, "\t}}");
        let _ = writeln!(out, "\tchain services {{");
        for line in &dispatch {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "\t}}");
        for (chain, hook) in [("prerouting", "prerouting"), ("output", "output")] {
            let _ = writeln!(out, "\tchain {chain} {{");
            let _ = writeln!(
                out,
                "\t\ttype nat hook {hook} priority -100; policy accept;"
            );
            let _ = writeln!(out, "\t\tjump services");
            let _ = writeln!(out, "\t}}");
        }
        let _ = writeln!(out, "}}");
        out
    }

    /// A table of the lab for its user: nodes, then pods with their IPs and namespaces, then the
    /// Service rules.
    pub fn render_summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "nodes:");
        for n in &self.nodes {
            let _ = writeln!(
                out,
                "  {:<10} netns {:<16} pods {:<16} underlay {}",
                n.name, n.netns, n.pod_subnet, n.underlay_addr
            );
        }
        let _ = writeln!(out, "pods:");
        for p in &self.pods {
            let managed = if p.managed { "" } else { " (unmanaged)" };
            let _ = writeln!(
                out,
                "  {:<32} {:<15} {:<8} netns {}{managed}",
                key(&p.namespace, &p.name),
                p.ip,
                p.node,
                p.netns
            );
        }
        let _ = writeln!(out, "services (kube-proxy stand-in):");
        for s in &self.services {
            let eps: Vec<String> = s.endpoints.iter().map(ToString::to_string).collect();
            let eps = if eps.is_empty() {
                "no ready endpoints".to_owned()
            } else {
                eps.join(" ")
            };
            let _ = writeln!(
                out,
                "  {:<32} {}:{}/{} -> {eps}",
                key(&s.namespace, &s.name),
                s.cluster_ip,
                s.port,
                proto_word(s.transport)
            );
        }
        for (ns, name) in &self.left_out {
            let _ = writeln!(out, "left out (no node or no IP): {}", key(ns, name));
        }
        out
    }
}

pub(super) fn proto_word(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Udp => "udp",
        Transport::Sctp => "sctp",
    }
}

fn endpoint_chain(ep: SocketAddrV4, proto: &str) -> String {
    let ip = ep.ip().to_string().replace('.', "-");
    format!("ep-{ip}-{}-{proto}", ep.port())
}
