//! A tiny DNS stub resolver: A records over UDP, with a resolv.conf search list and `ndots`.
//!
//! It exists so that the probe resolves names exactly as an application in the pod would (the
//! search list of the pod's resolv.conf, the daemon's mesh DNS on `127.0.0.53:53`), through a
//! socket opened by the probe's [`Connector`], that is, from inside the pod's namespace.
//!
//! The order of candidates is glibc's: a name with at least `ndots` dots is tried as written
//! first and then with each search domain; a name with fewer dots is tried with each search
//! domain first and as written last; a name ending in `.` is tried only as written.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::{Connector, ProbeError};
use aether::time;

/// Resolving a name failed.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The name cannot be a DNS name.
    #[error("invalid DNS name {name:?}")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// Every candidate got NXDOMAIN or no A record.
    #[error("{name}: no A record (tried {tried})")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The candidates tried, space-separated.
        tried: String,
    },
    /// No nameserver answered in time, or every one failed.
    #[error("{name}: no nameserver answered ({last})")]
    NoAnswer {
        /// The name asked for.
        name: String,
        /// The last failure.
        last: String,
    },
    /// The nameserver answered the candidate with a failure (SERVFAIL, REFUSED, ...).
    #[error("{name}: the nameserver failed ({answer})")]
    ServerFailed {
        /// The candidate asked for.
        name: String,
        /// Which server and what it answered.
        answer: String,
    },
    /// The query could not be encoded.
    #[error("encode a DNS query")]
    Encode(#[source] hickory_proto::ProtoError),
}

/// How to resolve names: nameservers, search list and `ndots`, as in resolv.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolver {
    /// The nameservers, tried in order.
    pub nameservers: Vec<SocketAddr>,
    /// The search domains, without trailing dots.
    pub search: Vec<String>,
    /// Names with at least this many dots are tried as written first.
    pub ndots: usize,
    /// How long to wait for one answer.
    pub timeout: Duration,
    /// How many rounds over the nameservers before giving up.
    pub attempts: usize,
}

impl Default for Resolver {
    /// resolv.conf's defaults: the local nameserver, no search list, `ndots:1`.
    fn default() -> Self {
        Self {
            nameservers: vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53)],
            search: Vec::new(),
            ndots: 1,
            timeout: Duration::from_secs(2),
            attempts: 2,
        }
    }
}

impl Resolver {
    /// The resolver of a pod in `namespace` under the mesh: the daemon's DNS on
    /// `127.0.0.53:53`, the cluster's search list, `ndots:5`.
    pub fn cluster(namespace: &str) -> Self {
        Self {
            nameservers: vec![SocketAddr::from(([127, 0, 0, 53], 53))],
            search: vec![
                format!("{namespace}.svc.cluster.local"),
                "svc.cluster.local".to_owned(),
                "cluster.local".to_owned(),
            ],
            ndots: 5,
            ..Self::default()
        }
    }

    /// Read resolv.conf text (`nameserver`, `search`, `domain`, `options ndots:N timeout:N
    /// attempts:N`). Unknown lines are ignored; what is missing keeps its default.
    pub fn parse_resolv_conf(text: &str) -> Self {
        let mut r = Self::default();
        let mut nameservers = Vec::new();
        let mut search = None;
        let mut domain = None;
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) {
                        nameservers.push(SocketAddr::new(ip, 53));
                    }
                }
                Some("search") => {
                    search = Some(
                        words
                            .map(|w| w.trim_end_matches('.').to_owned())
                            .collect::<Vec<_>>(),
                    );
                }
                Some("domain") => domain = words.next().map(|w| w.trim_end_matches('.').to_owned()),
                Some("options") => {
                    for opt in words {
                        let (k, v) = opt.split_once(':').unwrap_or((opt, ""));
                        match (k, v.parse::<u64>()) {
                            ("ndots", Ok(n)) => r.ndots = usize::try_from(n.min(15)).unwrap_or(15),
                            ("timeout", Ok(n)) => r.timeout = Duration::from_secs(n.clamp(1, 30)),
                            ("attempts", Ok(n)) => {
                                r.attempts = usize::try_from(n.clamp(1, 5)).unwrap_or(1);
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if !nameservers.is_empty() {
            r.nameservers = nameservers;
        }
        r.search = search
            .or_else(|| domain.map(|d| vec![d]))
            .unwrap_or_default();
        r
    }

    /// The fully qualified names tried for `name`, in order (without trailing dots).
    pub fn candidates(&self, name: &str) -> Vec<String> {
        if let Some(abs) = name.strip_suffix('.') {
            return vec![abs.to_owned()];
        }
        let searched = self.search.iter().map(|d| format!("{name}.{d}"));
        if name.matches('.').count() >= self.ndots {
            std::iter::once(name.to_owned()).chain(searched).collect()
        } else {
            searched.chain(std::iter::once(name.to_owned())).collect()
        }
    }

    /// The A records of `name`, resolved through sockets the `connector` opens. An IP literal
    /// is returned as is, and `localhost` is 127.0.0.1 (the stub reads no hosts file).
    pub async fn resolve(
        &self,
        connector: &Connector,
        name: &str,
    ) -> Result<Vec<IpAddr>, ProbeError> {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        if name.trim_end_matches('.').eq_ignore_ascii_case("localhost") {
            return Ok(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        }
        let candidates = self.candidates(name);
        // As glibc does, a candidate the server fails on (SERVFAIL, REFUSED) does not end the
        // search; the failure is reported only if no later candidate answers.
        let mut failed = None;
        for fqdn in &candidates {
            match self.query(connector, name, fqdn).await {
                Ok(Some(ips)) if !ips.is_empty() => return Ok(ips),
                Ok(_) => {}
                Err(ProbeError::Dns(e @ DnsError::ServerFailed { .. })) => failed = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(failed
            .unwrap_or(DnsError::NotFound {
                name: name.to_owned(),
                tried: candidates.join(" "),
            })
            .into())
    }

    /// One candidate: `Some(ips)` on an answer (possibly empty: NODATA), `None` on NXDOMAIN.
    async fn query(
        &self,
        connector: &Connector,
        name: &str,
        fqdn: &str,
    ) -> Result<Option<Vec<IpAddr>>, ProbeError> {
        let qname = Name::from_ascii(format!("{fqdn}.")).map_err(|_| DnsError::InvalidName {
            name: fqdn.to_owned(),
        })?;
        let mut msg = Message::query();
        msg.metadata.recursion_desired = true;
        msg.add_query(Query::query(qname, RecordType::A));
        let id = msg.metadata.id;
        let wire = msg.to_vec().map_err(DnsError::Encode)?;

        let mut last = String::from("no nameserver");
        let mut server_failed = None;
        for _ in 0..self.attempts.max(1) {
            for ns in &self.nameservers {
                match self.ask(connector, *ns, &wire, id).await {
                    Ok(reply) => match reply.metadata.response_code {
                        ResponseCode::NXDomain => return Ok(None),
                        ResponseCode::NoError => {
                            let ips = reply
                                .answers
                                .iter()
                                .filter_map(|r| match &r.data {
                                    RData::A(a) => Some(IpAddr::V4(a.0)),
                                    _ => None,
                                })
                                .collect();
                            return Ok(Some(ips));
                        }
                        code => server_failed = Some(format!("{ns}: {code}")),
                    },
                    Err(e) => last = format!("{ns}: {e}"),
                }
            }
        }
        if let Some(answer) = server_failed {
            return Err(DnsError::ServerFailed {
                name: fqdn.to_owned(),
                answer,
            }
            .into());
        }
        Err(DnsError::NoAnswer {
            name: name.to_owned(),
            last,
        }
        .into())
    }

    async fn ask(
        &self,
        connector: &Connector,
        ns: SocketAddr,
        wire: &[u8],
        id: u16,
    ) -> Result<Message, String> {
        let sock = connector.udp_socket(ns).map_err(|e| e.to_string())?;
        sock.connect(ns).await.map_err(|e| e.to_string())?;
        sock.send(wire).await.map_err(|e| e.to_string())?;
        let deadline = time::now() + self.timeout;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(time::now());
            let n = match tokio::time::timeout(left, sock.recv(&mut buf)).await {
                Err(_) => return Err("timed out".to_owned()),
                Ok(r) => r.map_err(|e| e.to_string())?,
            };
            // Ignore what is not the answer to this query (a late answer to an earlier one).
            if let Ok(m) = Message::from_vec(&buf[..n])
                && m.metadata.id == id
                && m.metadata.message_type == MessageType::Response
            {
                return Ok(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_gives_nameservers_search_and_ndots() {
        let r = Resolver::parse_resolv_conf(
            "# comment\nnameserver 10.96.0.10\nnameserver fd00::a\nsearch mp.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:1\n",
        );
        assert_eq!(
            r.nameservers,
            vec![
                "10.96.0.10:53".parse().unwrap(),
                "[fd00::a]:53".parse().unwrap()
            ]
        );
        assert_eq!(r.search.len(), 3);
        assert_eq!(r.ndots, 5);
        assert_eq!(r.timeout, Duration::from_secs(1));
    }

    #[test]
    fn short_names_try_the_search_list_first_and_absolute_names_only_themselves() {
        let r = Resolver::cluster("mp");
        assert_eq!(
            r.candidates("mp-multi"),
            vec![
                "mp-multi.mp.svc.cluster.local",
                "mp-multi.svc.cluster.local",
                "mp-multi.cluster.local",
                "mp-multi"
            ]
        );
        assert_eq!(
            r.candidates("mp-multi.mp.svc.cluster.local."),
            vec!["mp-multi.mp.svc.cluster.local"]
        );
        let r = Resolver {
            ndots: 1,
            ..Resolver::cluster("mp")
        };
        assert_eq!(r.candidates("a.b")[0], "a.b");
    }
}
