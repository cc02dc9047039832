//! HTTP/1.x by hand: the request is written byte for byte as asked (no `Host`, several `Host`
//! fields, userinfo, absolute form, CONNECT, HTTP/1.0 are all allowed), and the response is
//! parsed with `httparse`, its body framed by Content-Length, chunked coding, or the close.

use super::{HttpRequest, HttpVersion, Outcome, Reader, Target};

/// The request's bytes. `default_authority` is the `Host` value of [`super::Host::Default`].
pub(super) fn render(req: &HttpRequest, default_authority: &str) -> Vec<u8> {
    let version = match req.version {
        HttpVersion::Http10 => "HTTP/1.0",
        HttpVersion::Http11 | HttpVersion::H2c => "HTTP/1.1",
    };
    let target = match &req.target {
        Target::Origin(p) | Target::Absolute(p) | Target::Authority(p) => p.as_str(),
    };
    let mut out = format!("{} {} {}\r\n", req.method, target, version);
    for h in req.host_values(default_authority) {
        out.push_str(&format!("Host: {h}\r\n"));
    }
    let mut has_length = false;
    for (k, v) in &req.headers {
        has_length |=
            k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding");
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if !req.body.is_empty() && !has_length {
        out.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&req.body);
    bytes
}

/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

enum Head {
    /// Status, version, headers and the head's length.
    Done(u16, u8, Vec<(String, String)>, usize),
    Partial,
    Invalid(String),
}

fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let hs = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            Head::Done(resp.code.unwrap_or(0), resp.version.unwrap_or(1), hs, n)
        }
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Head::Partial,
        Ok(httparse::Status::Partial) => Head::Invalid("response head too long".to_owned()),
        Err(e) => Head::Invalid(format!("invalid response head: {e}")),
    }
}

/// Read one response into `out` (status, headers, body); `method` decides whether it has a body.
pub(super) async fn read_response(rd: &mut Reader<'_>, method: &str, out: &mut Outcome) {
    // The head, skipping interim 1xx answers (100 Continue); 101 is final.
    let (status, headers) = loop {
        match parse_head(&rd.buf) {
            Head::Done(status, version, headers, n) => {
                rd.buf.drain(..n);
                if (100..200).contains(&status) && status != 101 {
                    continue;
                }
                out.version = Some(if version == 0 { "HTTP/1.0" } else { "HTTP/1.1" }.to_owned());
                break (status, headers);
            }
            Head::Invalid(e) => {
                out.error = Some(e);
                out.body = std::mem::take(&mut rd.buf);
                return;
            }
            Head::Partial => {
                if !rd.fill(out).await {
                    if !rd.buf.is_empty() {
                        out.error =
                            Some("the connection ended inside the response head".to_owned());
                        out.body = std::mem::take(&mut rd.buf);
                    }
                    return;
                }
            }
        }
    };
    out.status = Some(status);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    let chunked = header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().trim_end().ends_with("chunked"));
    let length = header("content-length").and_then(|l| l.parse::<usize>().ok());
    out.headers = headers;

    let no_body = method.eq_ignore_ascii_case("HEAD")
        || status == 204
        || status == 304
        || status == 101
        || (method.eq_ignore_ascii_case("CONNECT") && (200..300).contains(&status));
    if no_body {
        return;
    }
    if chunked {
        read_chunked(rd, out).await;
    } else if let Some(len) = length {
        while rd.buf.len() < len && rd.buf.len() < rd.limit {
            if !rd.fill(out).await {
                out.error = Some(format!(
                    "the connection ended after {} of {len} body bytes",
                    rd.buf.len()
                ));
                break;
            }
        }
        let take = len.min(rd.buf.len());
        rd.take_body(take, out);
    } else {
        while rd.buf.len() < rd.limit && rd.fill(out).await {}
        let take = rd.buf.len();
        rd.take_body(take, out);
    }
}

async fn read_chunked(rd: &mut Reader<'_>, out: &mut Outcome) {
    loop {
        let (head, size) = match httparse::parse_chunk_size(&rd.buf) {
            Ok(httparse::Status::Complete((n, size))) => (n, size),
            Ok(httparse::Status::Partial) => {
                if !rd.fill(out).await {
                    out.error = Some("the connection ended inside a chunk".to_owned());
                    return;
                }
                continue;
            }
            Err(_) => {
                out.error = Some("invalid chunk size".to_owned());
                return;
            }
        };
        if size == 0 {
            return;
        }
        let Ok(size) = usize::try_from(size) else {
            out.error = Some("chunk too large".to_owned());
            return;
        };
        let need = head.saturating_add(size).saturating_add(2);
        while rd.buf.len() < need {
            if !rd.fill(out).await {
                out.error = Some("the connection ended inside a chunk".to_owned());
                let avail = rd.buf.len().saturating_sub(head).min(size);
                rd.buf.drain(..head.min(rd.buf.len()));
                rd.take_body(avail, out);
                return;
            }
        }
        rd.buf.drain(..head);
        rd.take_body(size, out);
        rd.buf.drain(..2);
        if out.truncated {
            return;
        }
    }
}
