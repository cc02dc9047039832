//! The mesh DNS server of one pod: answers A/AAAA for the names of a [`DnsTable`] and
//! forwards every other query, unchanged, to upstream resolvers (model.md §11).
//!
//! IO edge. It takes its sockets ready-made: the daemon binds the UDP socket and TCP listener
//! at 127.0.0.53:53 inside the pod's network namespace, and passes a factory that opens the
//! forwarding sockets there too (model.md §12.4), so this module never enters a namespace.
//!
//! Per query:
//! 1. a message that does not parse gets FORMERR when its id can be read and is not a
//!    response, and is dropped otherwise; a response is dropped (no reflection loops);
//! 2. an opcode other than QUERY gets NOTIMP; a query without exactly one question, FORMERR;
//! 3. class IN and a name of the table: the records (NOERROR, authoritative), or NOERROR with
//!    no answer when the name has none of the type asked;
//! 4. otherwise the query's bytes go to every upstream at once and the first reply with the
//!    query's id is relayed as it came; no upstream, or none within the timeout (2 s), is
//!    SERVFAIL.
//!
//! Nothing here panics on input; what is dropped or refused is counted in [`DnsStats`].
//! Search-path expansion is the client's (the pod's resolv.conf, see [`super::resolv_conf`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::select_ok;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::table::{DnsTable, Lookup, QueryKind};
use crate::accept::Acceptor;
use prometheus_client::metrics::counter::Counter;

/// How long a forwarded query waits for an upstream's reply before SERVFAIL.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// The TTL of the records the table answers, in seconds: short, because the table follows
/// the model.
pub const RECORD_TTL: u32 = 5;
/// The most UDP queries in flight; more are dropped (and counted).
const MAX_UDP_IN_FLIGHT: usize = 512;
/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// The limits of one server's DNS over TCP, which a client of the pod can hit (issue #8).
#[derive(Clone, Debug)]
pub struct TcpLimits {
    /// The most TCP connections open at once (node setting `dns_tcp_max_clients`, default 64).
    /// Kept apart from the UDP limit so that idle TCP clients cannot starve UDP.
    pub max_clients: usize,
    /// A query must arrive whole (its length and its bytes) within this long of its first
    /// byte (node setting `dns_tcp_query_timeout_ms`, default 5 s).
    pub query_timeout: Duration,
    /// Connections closed at once because `max_clients` were open.
    pub refused: Counter,
    /// Connections closed because a query did not arrive whole in time.
    pub timeouts: Counter,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_clients: 64,
            query_timeout: Duration::from_secs(5),
            refused: Counter::default(),
            timeouts: Counter::default(),
        }
    }
}
/// The UDP payload size our own answers advertise through EDNS.
const EDNS_PAYLOAD: u16 = 1232;

/// Opens a socket, in the pod's network namespace, from which to forward to the given
/// upstream (bound to an address of its family).
pub type ForwardSocketFactory = Arc<dyn Fn(SocketAddr) -> io::Result<UdpSocket> + Send + Sync>;

/// Counters of what the server did, for metrics and tests.
#[derive(Debug, Default)]
pub struct DnsStats {
    answered: AtomicU64,
    forwarded: AtomicU64,
    servfail: AtomicU64,
    formerr: AtomicU64,
    dropped: AtomicU64,
}

/// A reading of [`DnsStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsCounts {
    /// Queries answered from the table (records or no data).
    pub answered: u64,
    /// Queries whose upstream reply was relayed.
    pub forwarded: u64,
    /// SERVFAIL answers (no upstream, or none answered in time).
    pub servfail: u64,
    /// FORMERR and NOTIMP answers.
    pub formerr: u64,
    /// Messages dropped without an answer (unreadable, a response, or over the in-flight
    /// limit).
    pub dropped: u64,
}

impl DnsStats {
    /// The current counts.
    pub fn counts(&self) -> DnsCounts {
        DnsCounts {
            answered: self.answered.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            servfail: self.servfail.load(Ordering::Relaxed),
            formerr: self.formerr.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The DNS server of one pod.
///
/// Use: build it with the shared table handle, the upstreams and a forward-socket factory,
/// keep [`DnsServer::stats`] if wanted, then `tokio::spawn(server.run(udp, tcp))`; abort the
/// task to stop it. Swap a new table into the handle whenever the model changes.
pub struct DnsServer {
    table: Arc<ArcSwap<DnsTable>>,
    upstreams: Arc<[SocketAddr]>,
    forward_socket: ForwardSocketFactory,
    forward_timeout: Duration,
    stats: Arc<DnsStats>,
    udp_in_flight: Arc<Semaphore>,
    tcp_connections: Arc<Semaphore>,
    accept_errors: Counter,
    tcp: TcpLimits,
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer")
            .field("names", &self.table.load().len())
            .field("upstreams", &self.upstreams)
            .field("forward_timeout", &self.forward_timeout)
            .field("stats", &self.stats.counts())
            .finish_non_exhaustive()
    }
}

/// What to do with one incoming message: [`handle`]'s verdict.
#[derive(Debug)]
pub enum Handled {
    /// Send back these bytes, an answer from the table.
    Answer(Vec<u8>),
    /// Send back these bytes, a FORMERR or NOTIMP.
    Refuse(Vec<u8>),
    /// Forward the original bytes; the parsed query builds the SERVFAIL if that fails.
    Forward(Box<Message>),
    /// Send nothing.
    Drop,
}

impl DnsServer {
    /// A server answering from `table` and forwarding to `upstreams` (tried together) through
    /// sockets from `forward_socket`, with the 2 s forward timeout.
    pub fn new(
        table: Arc<ArcSwap<DnsTable>>,
        upstreams: Vec<SocketAddr>,
        forward_socket: ForwardSocketFactory,
    ) -> Self {
        Self {
            table,
            upstreams: upstreams.into(),
            forward_socket,
            forward_timeout: FORWARD_TIMEOUT,
            stats: Arc::default(),
            udp_in_flight: Arc::new(Semaphore::new(MAX_UDP_IN_FLIGHT)),
            tcp_connections: Arc::new(Semaphore::new(TcpLimits::default().max_clients)),
            accept_errors: Counter::default(),
            tcp: TcpLimits::default(),
        }
    }

    /// The same server with these TCP limits and counters.
    pub fn with_tcp_limits(mut self, limits: TcpLimits) -> Self {
        self.tcp_connections = Arc::new(Semaphore::new(limits.max_clients));
        self.tcp = limits;
        self
    }

    /// The same server, counting failed TCP accepts in `errors` (the daemon's
    /// `aether_accept_errors{listener="dns"}`).
    pub fn with_accept_errors(mut self, errors: Counter) -> Self {
        self.accept_errors = errors;
        self
    }

    /// The same server, counting into `stats` (shared by every pod's server of a daemon).
    pub fn with_stats(mut self, stats: Arc<DnsStats>) -> Self {
        self.stats = stats;
        self
    }

    /// The same server with another forward timeout (tests).
    pub fn with_forward_timeout(mut self, timeout: Duration) -> Self {
        self.forward_timeout = timeout;
        self
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<DnsStats> {
        Arc::clone(&self.stats)
    }

    /// Serves `udp` and `tcp` until the task is aborted.
    pub async fn run(self, udp: UdpSocket, tcp: TcpListener) {
        let this = Arc::new(self);
        let udp_task = Arc::clone(&this).run_udp(Arc::new(udp));
        let tcp_task = this.run_tcp(tcp);
        tokio::join!(udp_task, tcp_task);
    }

    async fn run_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        let mut buf = vec![0u8; 65535];
        // Consecutive receive errors: a lone one (an ICMP error of an earlier reply) is retried
        // at once; a run of them (out of memory, say) backs off from 5 ms up to 1 s, so that
        // the loop never spins a core.
        let mut failed: u32 = 0;
        loop {
            let (n, peer) = match socket.recv_from(&mut buf).await {
                Ok(got) => {
                    failed = 0;
                    got
                }
                Err(error) => {
                    tracing::debug!(%error, "mesh dns udp receive failed");
                    if failed > 0 {
                        let wait = Duration::from_millis(5 << (failed - 1).min(8))
                            .min(Duration::from_secs(1));
                        tokio::time::sleep(wait).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    failed = failed.saturating_add(1);
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&self.udp_in_flight).try_acquire_owned() else {
                DnsStats::bump(&self.stats.dropped);
                continue;
            };
            let query = buf[..n].to_vec();
            let this = Arc::clone(&self);
            let socket = Arc::clone(&socket);
            tokio::spawn(async move {
                if let Some(reply) = this.answer(&query).await
                    && let Err(error) = socket.send_to(&reply, peer).await
                {
                    tracing::debug!(%error, %peer, "mesh dns udp reply failed");
                }
                drop(permit);
            });
        }
    }

    async fn run_tcp(self: Arc<Self>, listener: TcpListener) {
        // Accept errors (out of descriptors) are waited out with a backoff, not retried at once.
        let mut acceptor = Acceptor::new(listener, "dns", self.accept_errors.clone());
        loop {
            let (stream, peer) = acceptor.accept().await;
            // Over the cap a new client is closed at once (and counted), rather than left in
            // the backlog for as long as the open ones last.
            let Ok(permit) = Arc::clone(&self.tcp_connections).try_acquire_owned() else {
                self.tcp.refused.inc();
                tracing::debug!(%peer, "mesh dns tcp connection closed: dns_tcp_max_clients open");
                drop(stream);
                continue;
            };
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                if let Err(error) = this.serve_tcp(stream).await {
                    tracing::debug!(%error, "mesh dns tcp connection ended");
                }
                drop(permit);
            });
        }
    }

    /// Length-prefixed messages (RFC 1035 §4.2.2), answered in order, until the client
    /// closes, idles (no first byte of a query for 10 s), is too slow (a query not whole within
    /// the query timeout of its first byte, counted) or sends something that is dropped.
    async fn serve_tcp(&self, mut stream: TcpStream) -> io::Result<()> {
        loop {
            let mut first = [0u8; 1];
            match tokio::time::timeout(TCP_IDLE, stream.read(&mut first)).await {
                Ok(Ok(0)) | Err(_) => return Ok(()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
            }
            let rest = async {
                let mut second = [0u8; 1];
                stream.read_exact(&mut second).await?;
                let mut query = vec![0u8; usize::from(u16::from_be_bytes([first[0], second[0]]))];
                stream.read_exact(&mut query).await?;
                Ok::<_, io::Error>(query)
            };
            let query = match tokio::time::timeout(self.tcp.query_timeout, rest).await {
                Ok(Ok(query)) => query,
                Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    self.tcp.timeouts.inc();
                    return Ok(());
                }
            };
            let Some(reply) = self.answer(&query).await else {
                return Ok(());
            };
            let Ok(reply_len) = u16::try_from(reply.len()) else {
                return Ok(());
            };
            stream.write_all(&reply_len.to_be_bytes()).await?;
            stream.write_all(&reply).await?;
        }
    }

    /// The bytes to send back for one message, if any.
    async fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let table = self.table.load_full();
        match handle(&table, query) {
            Handled::Answer(bytes) => {
                DnsStats::bump(&self.stats.answered);
                Some(bytes)
            }
            Handled::Refuse(bytes) => {
                DnsStats::bump(&self.stats.formerr);
                Some(bytes)
            }
            Handled::Drop => {
                DnsStats::bump(&self.stats.dropped);
                None
            }
            Handled::Forward(parsed) => match self.forward(query, parsed.metadata.id).await {
                Some(reply) => {
                    DnsStats::bump(&self.stats.forwarded);
                    Some(reply)
                }
                None => {
                    DnsStats::bump(&self.stats.servfail);
                    encode(&reply_to(&parsed, ResponseCode::ServFail))
                }
            },
        }
    }

    /// Sends `query` to every upstream and returns the first reply carrying its id.
    async fn forward(&self, query: &[u8], id: u16) -> Option<Vec<u8>> {
        if self.upstreams.is_empty() {
            return None;
        }
        let attempts = self.upstreams.iter().map(|&upstream| {
            Box::pin(async move {
                let socket = (self.forward_socket)(upstream)?;
                socket.connect(upstream).await?;
                socket.send(query).await?;
                let mut buf = vec![0u8; 65535];
                loop {
                    let n = socket.recv(&mut buf).await?;
                    let reply = &buf[..n];
                    // Only a response to this very query (its id, QR set) is relayed.
                    if n >= 12 && reply[..2] == id.to_be_bytes() && reply[2] & 0x80 != 0 {
                        return Ok::<_, io::Error>(reply.to_vec());
                    }
                }
            })
        });
        match tokio::time::timeout(self.forward_timeout, select_ok(attempts)).await {
            Ok(Ok((reply, _))) => Some(reply),
            Ok(Err(error)) => {
                tracing::debug!(%error, "mesh dns upstreams failed");
                None
            }
            Err(_) => None,
        }
    }
}

/// Decides the answer to one message from the table (steps 1 to 3 of the module doc).
///
/// Pure: the server's per-message decision without its sockets, public so that the fuzz
/// target (tests/fuzz.rs) feeds it any bytes.
pub fn handle(table: &DnsTable, bytes: &[u8]) -> Handled {
    let Ok(message) = Message::from_vec(bytes) else {
        return unparsable(bytes);
    };
    if message.metadata.message_type == MessageType::Response {
        return Handled::Drop;
    }
    if message.metadata.op_code != OpCode::Query {
        return refuse(&reply_to(&message, ResponseCode::NotImp));
    }
    let [query] = message.queries.as_slice() else {
        return refuse(&reply_to(&message, ResponseCode::FormErr));
    };
    if query.query_class() != DNSClass::IN {
        return Handled::Forward(Box::new(message));
    }
    let kind = match query.query_type() {
        RecordType::A => QueryKind::A,
        RecordType::AAAA => QueryKind::Aaaa,
        _ => QueryKind::Other,
    };
    let ips = match table.lookup(&query.name().to_ascii(), kind) {
        Lookup::NotOurs => return Handled::Forward(Box::new(message)),
        Lookup::NxDomain => {
            let mut reply = reply_to(&message, ResponseCode::NXDomain);
            reply.metadata.authoritative = true;
            return encode(&reply).map_or(Handled::Drop, Handled::Answer);
        }
        Lookup::NoData => Vec::new(),
        Lookup::Records(ips) => ips,
    };
    let mut reply = reply_to(&message, ResponseCode::NoError);
    reply.metadata.authoritative = true;
    for ip in ips {
        let rdata = match ip {
            std::net::IpAddr::V4(v4) => RData::A(A(v4)),
            std::net::IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        reply.add_answer(Record::from_rdata(query.name().clone(), RECORD_TTL, rdata));
    }
    encode(&reply).map_or(Handled::Drop, Handled::Answer)
}

fn refuse(reply: &Message) -> Handled {
    encode(reply).map_or(Handled::Drop, Handled::Refuse)
}

/// FORMERR for a message whose header can be read and that is not a response; otherwise
/// nothing.
fn unparsable(bytes: &[u8]) -> Handled {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return Handled::Drop;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let op_code = OpCode::from_u8((bytes[2] >> 3) & 0x0f);
    let mut reply = Message::error_msg(id, op_code, ResponseCode::FormErr);
    reply.metadata.recursion_desired = bytes[2] & 0x01 != 0;
    reply.metadata.recursion_available = true;
    refuse(&reply)
}

/// A response to `query` with its id, opcode, question, RD flag and EDNS presence.
fn reply_to(query: &Message, code: ResponseCode) -> Message {
    let mut reply = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_queries(query.queries.clone());
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        reply.set_edns(edns);
    }
    reply
}

fn encode(message: &Message) -> Option<Vec<u8>> {
    match message.to_vec() {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::debug!(%error, "mesh dns reply could not be encoded");
            None
        }
    }
}

#[cfg(test)]
mod tests;
