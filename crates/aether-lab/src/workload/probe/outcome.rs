//! What one attempt observed ([`Outcome`]), and how it reads and prints.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::GrpcAnswer;
use crate::workload::grpc::IDENT_HEADER;

fn ms<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&(d.as_secs_f64() * 1000.0)),
        None => s.serialize_none(),
    }
}

fn text<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(b))
}

/// How long the steps took, in milliseconds in JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// From the start of the connect to the connection (TCP).
    #[serde(serialize_with = "ms")]
    pub connect: Option<Duration>,
    /// From the end of sending (or from the connect, when nothing is sent) to the first byte
    /// of the answer (for HTTP, the status line).
    #[serde(serialize_with = "ms")]
    pub first_byte: Option<Duration>,
    /// From the start of the connect (after name resolution) to the end.
    #[serde(serialize_with = "ms")]
    pub total: Option<Duration>,
}

/// What one attempt observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// The address connected to (or sent to).
    pub addr: Option<SocketAddr>,
    /// Whether the TCP connection was established (false for UDP).
    pub connected: bool,
    /// Why the connect failed.
    pub connect_error: Option<String>,
    /// The HTTP status.
    pub status: Option<u16>,
    /// The HTTP version of the answer.
    pub version: Option<String>,
    /// The response headers, lower-case names, in order.
    pub headers: Vec<(String, String)>,
    /// The HTTP body, or every byte received after a raw send, wait or ClientHello, or the UDP
    /// reply; at most the body limit.
    #[serde(serialize_with = "text")]
    pub body: Vec<u8>,
    /// Whether bytes beyond the body limit were dropped.
    pub truncated: bool,
    /// Step timings.
    pub timings: Timings,
    /// Whether the peer closed the connection (end of stream seen).
    pub peer_closed: bool,
    /// Whether the peer reset the connection.
    pub reset: bool,
    /// Whether the overall timeout cut the attempt short.
    pub timed_out: bool,
    /// The source of the UDP reply.
    pub udp_from: Option<SocketAddr>,
    /// Any other failure (a malformed response, an HTTP/2 error), as text.
    pub error: Option<String>,
    /// The connection's own (source) address: requests with the same one went on the same
    /// connection.
    pub local_addr: Option<SocketAddr>,
    /// Whether the request went on a connection kept from an earlier request
    /// ([`Probe::run_many`](super::Probe::run_many) with keep-alive); `timings.connect` is then absent.
    pub reused: bool,
    /// For [`Send::Grpc`](super::Send::Grpc): the gRPC status and the echo's reply. `None` when no HTTP answer
    /// came (then `error`, `timed_out` or `connect_error` says why). The HTTP status, headers
    /// and, for an answer that is not gRPC (a mesh refusal), the body are in the fields above.
    pub grpc: Option<GrpcAnswer>,
}

impl Outcome {
    /// The first value of the response header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of the response header `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The mesh's reason: the `x-aether-error` header.
    pub fn reason(&self) -> Option<&str> {
        self.header("x-aether-error")
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body's first line, without its newline.
    pub fn first_line(&self) -> String {
        self.body_text().lines().next().unwrap_or("").to_owned()
    }

    /// One line for a person: status, reason, first body line, timings and how it ended.
    pub fn summary(&self) -> String {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.1}ms", d.as_secs_f64() * 1000.0),
            )
        };
        let mut line = match (&self.connect_error, self.status) {
            (Some(e), _) => format!("connect failed: {e}"),
            (None, Some(status)) => format!(
                "{status} {} {:?}",
                self.reason().unwrap_or("-"),
                self.first_line()
            ),
            (None, None) => format!("- - {:?}", self.first_line()),
        };
        line.push_str(&format!(
            " connect={} first_byte={} total={}",
            ms(self.timings.connect),
            ms(self.timings.first_byte),
            ms(self.timings.total)
        ));
        if let Some(from) = self.udp_from {
            line.push_str(&format!(" from={from}"));
        }
        if let Some(g) = &self.grpc {
            line.push_str(&format!(" grpc={}", g.code_name));
            if !g.message.is_empty() {
                line.push_str(&format!(" grpc_message={:?}", g.message));
            }
            if let Some(r) = &g.reply {
                line.push_str(&format!(
                    " ident={} pod={} method={} authority={}",
                    r.ident, r.pod, r.method, r.authority
                ));
            } else if let Some(ident) = self.ident() {
                line.push_str(&format!(" ident={ident}"));
            }
        }
        if self.reused {
            line.push_str(" reused");
        }
        for (flag, on) in [
            ("closed", self.peer_closed),
            ("reset", self.reset),
            ("timed-out", self.timed_out),
            ("truncated", self.truncated),
        ] {
            if on {
                line.push(' ');
                line.push_str(flag);
            }
        }
        if let Some(e) = &self.error {
            line.push_str(&format!(" error={e:?}"));
        }
        line
    }
}

/// `<name>:<port>`, as the echoes identify themselves.
fn is_ident(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(name, port)| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            && port.parse::<u16>().is_ok()
    })
}

impl Outcome {
    /// The echo's identity string `<workload>:<port>`: from the gRPC reply, the `x-echo-ident`
    /// header (a gRPC error answer), an HTTP echo's JSON body, or the body's first line (the
    /// HTTP, raw, server-first and UDP echoes). `None` for an answer no echo gave.
    pub fn ident(&self) -> Option<String> {
        if let Some(r) = self.grpc.as_ref().and_then(|g| g.reply.as_ref()) {
            return Some(r.ident.clone());
        }
        if let Some(i) = self.header(IDENT_HEADER) {
            return Some(i.to_owned());
        }
        if let Some(j) = self.json_body() {
            return match (j["workload"].as_str(), j["port"].as_u64()) {
                (Some(w), Some(p)) => Some(format!("{w}:{p}")),
                _ => None,
            };
        }
        let line = self.first_line();
        let line = line.strip_suffix(" ready").unwrap_or(&line);
        is_ident(line).then(|| line.to_owned())
    }

    /// The answering echo's pod: from the gRPC reply, `x-echo-pod`, an HTTP echo's JSON body,
    /// or the raw echoes' `pod <name>` line. `None` when unknown or empty.
    pub fn pod(&self) -> Option<String> {
        let pod = if let Some(r) = self.grpc.as_ref().and_then(|g| g.reply.as_ref()) {
            Some(r.pod.clone())
        } else if let Some(p) = self.header("x-echo-pod") {
            Some(p.to_owned())
        } else if let Some(j) = self.json_body() {
            j["pod"].as_str().map(str::to_owned)
        } else {
            self.body_text()
                .lines()
                .find_map(|l| l.strip_prefix("pod ").map(str::to_owned))
        };
        pod.filter(|p| !p.is_empty())
    }

    fn json_body(&self) -> Option<serde_json::Value> {
        if !self.body.starts_with(b"{") {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// Why there was no answer (`None` when there was one: an HTTP status, a UDP reply, or
    /// raw bytes): `connect: <error>`, `timed out`, `reset`, `closed`, or the error's text.
    pub fn failure(&self) -> Option<String> {
        let answered = self.status.is_some()
            || self.udp_from.is_some()
            || (!self.body.is_empty() && self.error.is_none());
        if answered {
            return None;
        }
        Some(if let Some(e) = &self.connect_error {
            format!("connect: {e}")
        } else if self.timed_out {
            "timed out".to_owned()
        } else if self.reset {
            "reset".to_owned()
        } else if let Some(e) = &self.error {
            e.clone()
        } else if self.peer_closed {
            "closed".to_owned()
        } else {
            "no answer".to_owned()
        })
    }
}
