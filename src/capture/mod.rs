//! Traffic capture in pod network namespaces (ARCHITECTURE.md "capture"; spec/model.md §12).
//!
//! - [`plan`] (PURE): a pod's capture settings -> the nftables ruleset and policy routing.
//! - [`nft`]: applies and removes a plan inside a namespace, through `nsenter`.
//! - [`cni`]: the unix-socket API between the `aether cni` entry point and the daemon.
//!
//! Which pods are local and when to apply is the daemon wiring's business; this module only
//! offers the steps. It never imports `proxy` (STYLE.md §6.2).

pub mod cni;
pub mod nft;
pub use aether_core::capture::plan;

#[cfg(test)]
mod tests;

/// The default gateways of the network namespace `netns` (IPv4 and IPv6), read from its
/// `/proc/<thread>/net/route` tables. On a bridge network a node's own connections to its pods
/// (kubelet probes) come from this address, so the inbound rules let it through (spec/model.md
/// §12.5 item 3). Unreadable tables give none.
pub fn gateways(netns: &crate::netns::Netns, home: &crate::netns::Netns) -> Vec<ipnet::IpNet> {
    let read = || {
        (
            std::fs::read_to_string("/proc/thread-self/net/route").unwrap_or_default(),
            std::fs::read_to_string("/proc/thread-self/net/ipv6_route").unwrap_or_default(),
        )
    };
    let Ok((v4, v6)) = netns.run(home, read) else {
        return Vec::new();
    };
    default_gateways_v4(&v4)
        .into_iter()
        .map(std::net::IpAddr::V4)
        .chain(
            default_gateways_v6(&v6)
                .into_iter()
                .map(std::net::IpAddr::V6),
        )
        .map(ipnet::IpNet::from)
        .collect()
}

/// The gateways of default routes in the text of `/proc/net/route` (addresses in
/// little-endian hex).
fn default_gateways_v4(table: &str) -> Vec<std::net::Ipv4Addr> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dest, gw, mask) = (f.get(1)?, f.get(2)?, f.get(7)?);
            if *dest != "00000000" || *mask != "00000000" {
                return None;
            }
            let gw = u32::from_str_radix(gw, 16).ok().filter(|g| *g != 0)?;
            Some(std::net::Ipv4Addr::from(gw.swap_bytes()))
        })
        .collect()
}

/// The next hops of default routes in the text of `/proc/net/ipv6_route`.
fn default_gateways_v6(table: &str) -> Vec<std::net::Ipv6Addr> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dest, plen, hop) = (f.first()?, f.get(1)?, f.get(4)?);
            if dest.bytes().any(|b| b != b'0') || *plen != "00" {
                return None;
            }
            let hop = u128::from_str_radix(hop, 16).ok().filter(|h| *h != 0)?;
            Some(std::net::Ipv6Addr::from(hop))
        })
        .collect()
}

#[cfg(test)]
mod gateway_tests {
    use super::*;

    #[test]
    fn default_routes_give_their_gateways() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0101F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t0001F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(
            default_gateways_v4(v4),
            vec![std::net::Ipv4Addr::new(10, 244, 1, 1)]
        );
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n\
                  fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n";
        assert_eq!(
            default_gateways_v6(v6),
            vec!["fd00::1".parse::<std::net::Ipv6Addr>().unwrap()]
        );
        assert!(default_gateways_v4("garbage\n\n x y").is_empty());
        assert!(default_gateways_v6("").is_empty());
    }
}
