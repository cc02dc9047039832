//! PURE: one pod's capture settings -> the nftables ruleset and policy routing that capture its
//! outbound traffic (spec/model.md §12.1, §12.2).
//!
//! [`plan`] is total and deterministic: the same [`PodCapture`] always renders the same text. The
//! ruleset is one `table inet aether`, applied atomically with `nft -f`; its first lines create
//! and delete any earlier version of the table, so applying it again replaces it. The routing
//! half is a list of `ip` argument vectors ([`IpCommand`]) with their removals.
//!
//! This file is checked by `scripts/check-purity.sh`: no IO, no clock, no process spawning.

use crate::prelude::*;

use std::fmt::{self, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::marks::{ROUTE_TABLE, RULE_PRIORITY, SOCKET_MARK, TPROXY_MARK};

/// The name of the nftables table (family `inet`) that holds a pod's capture rules.
pub const TABLE: &str = "aether";

/// The named counter of plaintext connections refused by the input hook (§12.5 item 3):
/// `nft list counter inet aether plaintext_refused` in the pod's namespace.
pub const PLAINTEXT_COUNTER: &str = "plaintext_refused";

/// The transparent TCP capture port (spec/model.md §12.3).
pub const CAPTURE_PORT: u16 = 18001;

/// The proxy port, captured in both modes.
pub const PROXY_PORT: u16 = 18081;

/// The legacy port, captured for TCP and UDP in both modes; the transparent UDP listener's port.
pub const LEGACY_PORT: u16 = 18082;

/// Which outbound TCP a pod's rules capture (spec/model.md §12.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// All outbound TCP except the exclusions.
    RedirectAll,
    /// TCP to 18081 and 18082 only.
    Scoped,
}

impl Mode {
    /// The spelling used in the spec and in the rendered ruleset.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RedirectAll => "redirect-all",
            Self::Scoped => "scoped",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What capture needs to know about one managed pod.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodCapture {
    /// The pod's Kubernetes namespace (named in the ruleset's comment only).
    pub namespace: String,
    /// The pod's name (named in the ruleset's comment only).
    pub name: String,
    /// The pod's IPv4 address, if it has one: selects the IPv4 policy routing.
    pub ipv4: Option<Ipv4Addr>,
    /// The pod's IPv6 address, if it has one: selects the IPv6 policy routing.
    pub ipv6: Option<Ipv6Addr>,
    /// The capture mode.
    pub mode: Mode,
    /// `capture.aether.io/exclude-outbound-ports`: destination ports never captured.
    pub exclude_ports: Vec<u16>,
    /// `capture.aether.io/exclude-outbound-ip-ranges`: destinations never captured.
    pub exclude_ranges: Vec<IpNet>,
    /// Whether marked UDP goes to the transparent UDP listener on 18082 (only while a UDPRoute
    /// applies to the pod's traffic); without it, marked UDP is dropped.
    pub udp: bool,
    /// The TCP ports on which a connection from outside the pod is refused (spec/model.md
    /// §12.5 item 3): the pod's declared ports when it is `strict` or guarded by a
    /// service-level authorization; empty lets plaintext through.
    #[serde(default)]
    pub inbound_refused_ports: Vec<u16>,
    /// Sources let through to those ports anyway: the node's addresses (kubelet probes), the
    /// pod's gateway, the node's `inbound_trusted_sources`.
    #[serde(default)]
    pub inbound_trusted: Vec<IpNet>,
}

/// An address family of the policy routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 (`ip -4`).
    V4,
    /// IPv6 (`ip -6`).
    V6,
}

impl Family {
    fn flag(self) -> &'static str {
        match self {
            Self::V4 => "-4",
            Self::V6 => "-6",
        }
    }

    fn any(self) -> &'static str {
        match self {
            Self::V4 => "0.0.0.0/0",
            Self::V6 => "::/0",
        }
    }
}

/// What an [`IpCommand`] manages, so that its runner knows which failures mean "already done".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpObject {
    /// An `ip rule`.
    Rule,
    /// An `ip route`.
    Route,
}

/// Whether an [`IpCommand`] adds or removes its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpAction {
    /// `add`: an object that already exists is not an error.
    Add,
    /// `del`: an object that is already missing is not an error.
    Del,
}

/// One `ip` invocation: the arguments after the program name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IpCommand {
    /// The family.
    pub family: Family,
    /// Rule or route.
    pub object: IpObject,
    /// Add or remove.
    pub action: IpAction,
    /// The arguments after `ip`, starting with the family flag.
    pub args: Vec<String>,
}

impl fmt::Display for IpCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ip")?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

fn ip_command(family: Family, object: IpObject, action: IpAction) -> IpCommand {
    let verb = match action {
        IpAction::Add => "add",
        IpAction::Del => "del",
    };
    let table = ROUTE_TABLE.to_string();
    let mut args = vec![family.flag().to_owned()];
    match object {
        IpObject::Rule => {
            args.extend(["rule", verb, "fwmark"].map(str::to_owned));
            args.push(hex(TPROXY_MARK));
            args.extend(["lookup".to_owned(), table]);
            args.extend(["priority".to_owned(), RULE_PRIORITY.to_string()]);
        }
        IpObject::Route => {
            args.extend(
                ["route", verb, "local", family.any(), "dev", "lo", "table"].map(str::to_owned),
            );
            args.push(table);
        }
    }
    IpCommand {
        family,
        object,
        action,
        args,
    }
}

/// The commands that install the policy routing of `family`: marked packets are delivered
/// locally (rule, then route).
pub fn route_adds(family: Family) -> Vec<IpCommand> {
    vec![
        ip_command(family, IpObject::Rule, IpAction::Add),
        ip_command(family, IpObject::Route, IpAction::Add),
    ]
}

/// The commands that remove the policy routing of `family` (rule first, so that nothing is
/// looked up in a table being emptied).
pub fn route_dels(family: Family) -> Vec<IpCommand> {
    vec![
        ip_command(family, IpObject::Rule, IpAction::Del),
        ip_command(family, IpObject::Route, IpAction::Del),
    ]
}

/// The ruleset that removes the table whether or not it exists.
pub fn removal_ruleset() -> String {
    format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\n")
}

/// A pod's capture, ready to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturePlan {
    pod: PodCapture,
    ranges_v4: Vec<Ipv4Net>,
    ranges_v6: Vec<Ipv6Net>,
    ports: Vec<u16>,
}

/// Plan the capture of one pod. Exclusions are normalised: ports sorted without duplicates,
/// ranges stripped of host bits and merged where they overlap or touch.
pub fn plan(pod: &PodCapture) -> CapturePlan {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for net in &pod.exclude_ranges {
        match net.trunc() {
            IpNet::V4(n) => v4.push(n),
            IpNet::V6(n) => v6.push(n),
        }
    }
    let mut ports = pod.exclude_ports.clone();
    ports.sort_unstable();
    ports.dedup();
    CapturePlan {
        pod: pod.clone(),
        ranges_v4: Ipv4Net::aggregate(&v4),
        ranges_v6: Ipv6Net::aggregate(&v6),
        ports,
    }
}

fn hex(mark: u32) -> String {
    format!("{mark:#010x}")
}

fn set<T: fmt::Display>(items: &[T]) -> String {
    match items {
        [one] => one.to_string(),
        _ => {
            let inner: Vec<String> = items.iter().map(ToString::to_string).collect();
            format!("{{ {} }}", inner.join(", "))
        }
    }
}

impl CapturePlan {
    /// The pod this plan captures.
    pub fn pod(&self) -> &PodCapture {
        &self.pod
    }

    /// The families the pod has an address of, IPv4 first.
    pub fn families(&self) -> Vec<Family> {
        let mut out = Vec::new();
        if self.pod.ipv4.is_some() {
            out.push(Family::V4);
        }
        if self.pod.ipv6.is_some() {
            out.push(Family::V6);
        }
        out
    }

    /// The rules of the output hook, in order, each with the comment that names its spec rule.
    /// The first is always the accept of the daemon's own sockets (U14).
    pub fn output_rules(&self) -> Vec<(String, Vec<String>)> {
        let socket = hex(SOCKET_MARK);
        let tproxy = hex(TPROXY_MARK);
        let mut out = vec![
            (
                "1. the daemon's own sockets (§12.4) are never captured; their connections are remembered".to_owned(),
                vec![format!("meta mark {socket} ct mark set {socket} accept")],
            ),
            (
                "2. the pod's replies on a connection the daemon opened to it go back to that socket".to_owned(),
                vec![format!("meta l4proto tcp ct mark {socket} meta mark set {tproxy} accept")],
            ),
            (
                "2b. the pod's answers on connections it accepted are not outbound dials".to_owned(),
                vec!["ct direction reply accept".to_owned()],
            ),
            (
                "3. loopback destinations are never captured".to_owned(),
                vec![
                    "ip daddr 127.0.0.0/8 accept".to_owned(),
                    "ip6 daddr ::1 accept".to_owned(),
                ],
            ),
        ];
        let mut excluded = Vec::new();
        if !self.ranges_v4.is_empty() {
            excluded.push(format!("ip daddr {} accept", set(&self.ranges_v4)));
        }
        if !self.ranges_v6.is_empty() {
            excluded.push(format!("ip6 daddr {} accept", set(&self.ranges_v6)));
        }
        if !self.ports.is_empty() {
            excluded.push(format!(
                "meta l4proto {{ tcp, udp }} th dport {} accept",
                set(&self.ports)
            ));
        }
        if !excluded.is_empty() {
            out.push((
                "4. exclude-outbound-ip-ranges and exclude-outbound-ports are never captured"
                    .to_owned(),
                excluded,
            ));
        }
        out.push((
            format!("5. UDP to {LEGACY_PORT} is captured (both modes)"),
            vec![format!(
                "udp dport {LEGACY_PORT} meta mark set {tproxy} accept"
            )],
        ));
        out.push((
            format!("6. TCP to {PROXY_PORT} and {LEGACY_PORT} is captured (both modes)"),
            vec![format!(
                "tcp dport {{ {PROXY_PORT}, {LEGACY_PORT} }} meta mark set {tproxy} accept"
            )],
        ));
        if self.pod.mode == Mode::RedirectAll {
            out.push((
                "7. redirect-all: every other TCP is captured".to_owned(),
                vec![format!("meta l4proto tcp meta mark set {tproxy} accept")],
            ));
        }
        out
    }

    /// The rules of the prerouting hook: marked TCP to the capture listener, marked UDP to the
    /// UDP listener or dropped.
    pub fn prerouting_rules(&self) -> Vec<(String, Vec<String>)> {
        let tproxy = hex(TPROXY_MARK);
        let mut out = vec![(
            format!("marked TCP goes to the transparent capture listener on {CAPTURE_PORT}"),
            vec![
                format!(
                    "meta mark {tproxy} meta nfproto ipv4 meta l4proto tcp tproxy ip to :{CAPTURE_PORT} accept"
                ),
                format!(
                    "meta mark {tproxy} meta nfproto ipv6 meta l4proto tcp tproxy ip6 to :{CAPTURE_PORT} accept"
                ),
            ],
        )];
        out.push((
            format!(
                "unmarked TCP to {CAPTURE_PORT} was not sent by these rules: refused (§12.5 item 4)"
            ),
            vec![format!("tcp dport {CAPTURE_PORT} reject with tcp reset")],
        ));
        if self.pod.udp {
            out.push((
                format!("marked UDP goes to the transparent UDP listener on {LEGACY_PORT}"),
                vec![
                    format!(
                        "meta mark {tproxy} meta nfproto ipv4 meta l4proto udp tproxy ip to :{LEGACY_PORT} accept"
                    ),
                    format!(
                        "meta mark {tproxy} meta nfproto ipv6 meta l4proto udp tproxy ip6 to :{LEGACY_PORT} accept"
                    ),
                ],
            ));
        } else {
            out.push((
                "no UDP listener: marked UDP is dropped".to_owned(),
                vec![format!("meta mark {tproxy} meta l4proto udp drop")],
            ));
        }
        out
    }

    /// The rules of the input hook (spec/model.md §12.5 item 3): connections from outside the
    /// pod to the refused ports are reset, except from loopback (the daemon's own deliveries
    /// and the pod itself) and the trusted sources. Empty when nothing is refused.
    pub fn input_rules(&self) -> Vec<(String, Vec<String>)> {
        let pod = &self.pod;
        if pod.inbound_refused_ports.is_empty() {
            return Vec::new();
        }
        let mut ports = pod.inbound_refused_ports.clone();
        ports.sort_unstable();
        ports.dedup();
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for net in &pod.inbound_trusted {
            match net.trunc() {
                IpNet::V4(n) => v4.push(n),
                IpNet::V6(n) => v6.push(n),
            }
        }
        let (v4, v6) = (Ipv4Net::aggregate(&v4), Ipv6Net::aggregate(&v6));
        let mut out = vec![(
            "loopback: the pod itself, and the daemon's deliveries from the mesh hop".to_owned(),
            vec!["iifname \"lo\" accept".to_owned()],
        )];
        let mut trusted = Vec::new();
        if !v4.is_empty() {
            trusted.push(format!("ip saddr {} accept", set(&v4)));
        }
        if !v6.is_empty() {
            trusted.push(format!("ip6 saddr {} accept", set(&v6)));
        }
        if !trusted.is_empty() {
            out.push((
                "the node (kubelet probes), the pod's gateway, trusted sources".to_owned(),
                trusted,
            ));
        }
        out.push((
            "plaintext from outside the mesh to a declared port is refused (§12.5 item 3)"
                .to_owned(),
            vec![format!(
                "tcp dport {} ct state new counter name {PLAINTEXT_COUNTER} reject with tcp reset",
                set(&ports)
            )],
        ));
        out
    }

    /// The nftables ruleset, for `nft -f`. It replaces any earlier version of the table in one
    /// transaction.
    pub fn ruleset(&self) -> String {
        let mut s = String::new();
        let pod = &self.pod;
        // Writing to a String cannot fail; the results are ignored through `let _`.
        // The names are data: escaped, so that a line end in one cannot end the comment and
        // make the rest of the name a rule (the file registry takes names as written).
        let _ = writeln!(
            s,
            "# aether capture for pod {}/{} ({} mode), spec/model.md §12.1",
            pod.namespace.escape_debug(),
            pod.name.escape_debug(),
            pod.mode
        );
        let _ = writeln!(
            s,
            "# The next two lines remove any earlier version, so applying this again replaces it."
        );
        s.push_str(&removal_ruleset());
        let _ = writeln!(s, "table inet {TABLE} {{");
        let _ = writeln!(s, "\tchain output {{");
        let _ = writeln!(
            s,
            "\t\ttype route hook output priority mangle; policy accept;"
        );
        write_rules(&mut s, &self.output_rules());
        let _ = writeln!(s, "\t}}\n");
        let _ = writeln!(s, "\tchain prerouting {{");
        let _ = writeln!(
            s,
            "\t\ttype filter hook prerouting priority mangle; policy accept;"
        );
        write_rules(&mut s, &self.prerouting_rules());
        let _ = writeln!(s, "\t}}");
        let input = self.input_rules();
        if !input.is_empty() {
            let _ = writeln!(s, "\n\tcounter {PLAINTEXT_COUNTER} {{}}\n");
            let _ = writeln!(s, "\tchain input {{");
            let _ = writeln!(
                s,
                "\t\ttype filter hook input priority filter; policy accept;"
            );
            write_rules(&mut s, &input);
            let _ = writeln!(s, "\t}}");
        }
        let _ = writeln!(s, "}}");
        s
    }

    /// The policy-routing commands, IPv4 first, for each family the pod has an address of.
    pub fn route_commands(&self) -> Vec<IpCommand> {
        self.families().into_iter().flat_map(route_adds).collect()
    }

    /// The commands that undo [`Self::route_commands`].
    pub fn route_removals(&self) -> Vec<IpCommand> {
        self.families().into_iter().flat_map(route_dels).collect()
    }
}

fn write_rules(s: &mut String, rules: &[(String, Vec<String>)]) {
    for (comment, lines) in rules {
        let _ = writeln!(s, "\t\t# {comment}");
        for line in lines {
            let _ = writeln!(s, "\t\t{line}");
        }
    }
}
