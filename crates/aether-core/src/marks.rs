//! The packet marks and routing table that capture programs and the proxy's sockets carry.
//!
//! Shared by `capture` (which writes them into each pod's rules) and `proxy` (whose sockets
//! carry [`SOCKET_MARK`]); neither imports the other (STYLE.md §6.2). Layer 0.

/// The mark on every socket the daemon opens in a pod's network namespace. Output rule 1 of
/// spec/model.md §12.1 accepts it before any capture rule, and it is copied to the connection's
/// conntrack mark so that the application's replies to a transparent delivery socket find
/// their way back (see [`TPROXY_MARK`]).
pub const SOCKET_MARK: u32 = 0x0a37_0001;

/// The mark on captured packets: policy routing sends them to `lo`, where prerouting hands
/// TCP to TPROXY on 18001 and UDP to 18082.
pub const TPROXY_MARK: u32 = 0x0a37_0002;

/// The routing table that delivers [`TPROXY_MARK`]ed packets locally.
pub const ROUTE_TABLE: u32 = 18001;

/// The priority of the `ip rule` that selects [`ROUTE_TABLE`].
pub const RULE_PRIORITY: u32 = 18001;

/// The `User-Agent` of the daemon's delegated liveness probes (`node::liveness`, spec/model.md
/// §14): the echo workload answers them but does not count them as the traffic its counters
/// show (leg MIR counts the requests mp-authz echoed).
pub const LIVENESS_USER_AGENT: &str = "aether-liveness";
