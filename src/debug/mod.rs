//! `aether debug`: the node-local debug CLI (issue #10 §3). The daemon answers on its admin
//! unix socket (`crate::node::debug`, the `/debug/*` and `/config_dump` endpoints); this
//! module holds what both sides share (the views of [`view`], the explain request) and the
//! client that calls the socket and prints the answers ([`client`]).

pub mod client;
pub mod view;

use serde::{Deserialize, Serialize};

use crate::explain::{Bytes, Question};

/// One `aether explain` question as the CLI flags give it: what `aether debug explain` posts
/// to the daemon, and what `aether explain` reads offline. Both turn it into a [`Question`]
/// with [`ExplainRequest::question`], so the live and the offline answers read the flags alike.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExplainRequest {
    /// The calling pod, `<namespace>/<pod>`.
    pub from: String,
    /// What the client dials, `<name-or-ip>:<port>`.
    pub dial: String,
    /// `Host` fields (empty: the dialled authority; an empty string among them is dropped,
    /// so `[""]` sends none).
    pub host: Vec<String>,
    /// The absolute-form authority, when the request line carries one.
    pub absolute: Option<String>,
    /// The path (default `/`).
    pub path: Option<String>,
    /// The method (default `GET`).
    pub method: Option<String>,
    /// Request headers, `name:value` each.
    pub headers: Vec<String>,
    /// What the client sends first (`http`, `http1.0`, `h2c`, `tls:<sni>`, `raw`, `none`,
    /// `udp`; default `http`).
    pub bytes: Option<String>,
    /// Entropy for a weighted backend choice.
    pub entropy: u64,
}

impl ExplainRequest {
    /// The question, or what is wrong with the request.
    pub fn question(&self) -> Result<Question, String> {
        let mut headers = Vec::new();
        for h in &self.headers {
            let Some((k, v)) = h.split_once(':') else {
                return Err(format!("--header {h:?}: expected name:value"));
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        // The mesh removes every x-aether- header a client sends before anything reads it (I12).
        headers.retain(|(k, _)| !k.starts_with(crate::resolve::answer::MESH_HEADER_PREFIX));
        let hosts = (!self.host.is_empty()).then(|| {
            self.host
                .iter()
                .filter(|h| !h.is_empty())
                .cloned()
                .collect()
        });
        let bytes = match &self.bytes {
            Some(b) => b.parse::<Bytes>()?,
            None => Bytes::Http,
        };
        if self.from.is_empty() {
            return Err("--from is required: the calling pod, <namespace>/<pod>".into());
        }
        if self.dial.is_empty() {
            return Err("--dial is required: <name-or-ip>:<port>".into());
        }
        Ok(Question {
            from: self.from.clone(),
            dial: self.dial.clone(),
            hosts,
            absolute: self.absolute.clone(),
            method: self.method.clone().unwrap_or_else(|| "GET".into()),
            path: self.path.clone().unwrap_or_else(|| "/".into()),
            headers,
            bytes,
            entropy: self.entropy,
        })
    }
}

/// A wall-clock time as RFC 3339 in UTC, to the second (`2026-12-02T11:34:17Z`).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(d) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            d.year(),
            u8::from(d.month()),
            d.day(),
            d.hour(),
            d.minute(),
            d.second()
        ),
        Err(_) => format!("{secs}s since 1970"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_211_257);
        assert_eq!(rfc3339(t), "2026-12-02T11:34:17Z");
    }

    #[test]
    fn a_request_reads_its_flags_as_aether_explain_does() {
        let r = ExplainRequest {
            from: "mp/mp-client".into(),
            dial: "mp-multi.mp.aether.internal:8080".into(),
            host: vec![String::new()],
            headers: vec!["X-Env: blue".into(), "x-aether-error: forged".into()],
            bytes: Some("h2c".into()),
            ..ExplainRequest::default()
        };
        let q = r.question().unwrap();
        assert_eq!(q.hosts, Some(Vec::new()));
        assert_eq!(q.headers, [("x-env".to_owned(), "blue".to_owned())]);
        assert_eq!(q.bytes, Bytes::H2c);
        assert_eq!((q.method.as_str(), q.path.as_str()), ("GET", "/"));
        let bad = ExplainRequest {
            headers: vec!["nocolon".into()],
            ..r.clone()
        };
        assert!(bad.question().unwrap_err().contains("name:value"));
        let bad = ExplainRequest {
            bytes: Some("smtp".into()),
            ..r.clone()
        };
        assert!(bad.question().unwrap_err().contains("--bytes"));
        let bad = ExplainRequest {
            from: String::new(),
            ..r
        };
        assert!(bad.question().unwrap_err().contains("--from"));
    }
}
