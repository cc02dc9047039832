//! A pod's resolv.conf, and the upstream resolvers read from the host's.
//!
//! PURE: text in, text or addresses out.

use crate::prelude::*;

use std::net::{IpAddr, SocketAddr};

/// The resolv.conf of a pod in `namespace` whose resolver is `nameserver` (the mesh DNS at
/// 127.0.0.53): the Kubernetes search path and `ndots:5`, as the kubelet writes it.
pub fn resolv_conf(nameserver: IpAddr, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "nameserver {nameserver}\n\
         search {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\n\
         options ndots:5\n"
    )
}

/// The `nameserver` lines of a resolv.conf, as port-53 addresses, in file order.
///
/// Loopback addresses are left out: the server forwards from inside a pod's network
/// namespace, where a loopback nameserver is not the host's (127.0.0.53 there is the mesh
/// DNS itself, so forwarding to it would loop). On a host running systemd-resolved, read
/// `/run/systemd/resolve/resolv.conf`, which lists the real upstreams. Lines that do not
/// parse (including link-local addresses with a zone) are skipped.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next() != Some("nameserver") {
                return None;
            }
            let ip: IpAddr = words.next()?.parse().ok()?;
            (!ip.is_loopback()).then_some(SocketAddr::new(ip, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_resolv_conf_points_at_the_mesh_dns_with_the_kubernetes_search_path() {
        let text = resolv_conf("127.0.0.53".parse().unwrap(), "mp", "cluster.local");
        assert_eq!(
            text,
            "nameserver 127.0.0.53\n\
             search mp.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5\n"
        );
    }

    #[test]
    fn upstreams_are_the_nameserver_lines_without_loopback() {
        let text = "# comment\n\
                    ; another\n\
                    nameserver 10.0.0.2\n\
                    search example.com\n\
                    nameserver 127.0.0.53\n\
                    nameserver ::1\n\
                    nameserver fe80::1%eth0\n\
                    nameserver  2001:db8::53  \n\
                    nameserver\n\
                    nameserver bogus\n\
                    #nameserver 10.9.9.9\n";
        assert_eq!(
            parse_resolv_conf(text),
            vec![
                "10.0.0.2:53".parse().unwrap(),
                "[2001:db8::53]:53".parse().unwrap()
            ]
        );
    }
}
