//! The mesh's wire contract that both ends of a hop, and the test kit, must agree on: the ALPN
//! of each kind of hop, the daemon's well-known ports, and the headers only the mesh may write.
//! Plain constants, so the daemon's proxy and the lab's clients name one definition.

/// ALPN of an HTTP mesh hop (HTTP/2).
pub const ALPN_HTTP: &[u8] = b"h2";
/// ALPN of a raw-TCP mesh hop (a byte stream).
pub const ALPN_TCP: &[u8] = b"aether-tcp/1";
/// ALPN of an HTTP/1.1 mesh hop that carries one request asking to switch protocols
/// (`Upgrade`, addressing.md I11): HTTP/2 cannot carry it, so it gets a connection of its own,
/// checked at the destination as the HTTP class.
pub const ALPN_H1: &[u8] = b"aether-h1/1";
/// ALPN of an L4 mesh hop (model.md §12.5 item 1): the bytes of a connection the source would
/// have passed through, to a port the destination pod declares (raw TCP or HTTP); the
/// destination serves an HTTP port's bytes as HTTP, with its filters.
pub const ALPN_L4: &[u8] = b"aether-l4/1";
/// Every ALPN the inbound hop serves, in preference order (the destination's TLS offers these).
pub const ALPNS: &[&[u8]] = &[ALPN_HTTP, ALPN_TCP, ALPN_H1, ALPN_L4];

/// The mesh hop port on every pod IP.
pub const HOP_PORT: u16 = 18008;
/// The capture port.
pub const CAPTURE_PORT: u16 = 18001;
/// The proxy port.
pub const PROXY_PORT: u16 = 18081;
/// The legacy raw-TCP and UDP port.
pub const LEGACY_PORT: u16 = 18082;

/// Authorization check header: the Service whose filter asks (`ns/name`). Not an `x-aether-`
/// header: those are removed from every request the mesh delivers (I12), the check included.
/// A client's own copy is never passed into a check.
pub const AUTHZ_SERVICE: &str = "x-authz-service";
/// Authorization check header: the caller's SPIFFE ID.
pub const AUTHZ_CALLER: &str = "x-authz-caller";

/// A client's copy of the header that proves a workload certificate to an application. The mesh
/// never sets it, so a client's copy is a forgery: removed at entry.
pub const FORWARDED_CLIENT_CERT: &str = "x-forwarded-client-cert";

/// Headers only the mesh may write besides the `x-aether-` ones: the two headers of an
/// authorization check and the client-certificate header. A client's copies are removed when
/// the daemon reads its request (`strip_client_request` of the proxy), like the `x-aether-` headers (I12).
pub const MESH_ONLY: [&str; 3] = [AUTHZ_SERVICE, AUTHZ_CALLER, FORWARDED_CLIENT_CERT];
