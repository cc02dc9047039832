//! The client side of `tests/direct.rs`: exact request bytes out, the response as the client
//! reads it (status, headers, body).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response as a client sees it.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status code.
    pub(crate) status: u16,
    /// Every header, names lower-case, in order.
    pub(crate) headers: Vec<(String, String)>,
    /// The body.
    pub(crate) body: String,
}

impl Answer {
    /// The first value of `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `x-aether-error` reason.
    pub(crate) fn reason(&self) -> Option<&str> {
        self.header("x-aether-error")
    }
}

/// Parse one HTTP/1.1 response (the whole of what was read).
pub(crate) fn parse(bytes: &[u8]) -> Answer {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(bytes).expect("an HTTP/1.1 response") else {
        panic!(
            "an incomplete response: {:?}",
            String::from_utf8_lossy(bytes)
        );
    };
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut body = &bytes[head..];
    if let Some((_, len)) = headers.iter().find(|(n, _)| n == "content-length") {
        body = &body[..len.parse::<usize>().unwrap()];
    }
    Answer {
        status: resp.code.unwrap(),
        headers,
        body: String::from_utf8_lossy(body).into_owned(),
    }
}

/// Connect to `addr`, send `raw`, read until the server closes (at most 5 s).
pub(crate) async fn exchange(addr: SocketAddr, raw: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got))
        .await
        .expect("the server answers and closes within 5 s")
        .unwrap();
    got
}

/// `GET <target>` with `Host: <host>`, these extra header lines, and `Connection: close`.
pub(crate) async fn get(addr: SocketAddr, target: &str, host: &str, extra: &[&str]) -> Answer {
    let mut raw = format!("GET {target} HTTP/1.1\r\nhost: {host}\r\n");
    for line in extra {
        raw.push_str(line);
        raw.push_str("\r\n");
    }
    raw.push_str("connection: close\r\n\r\n");
    parse(&exchange(addr, raw.as_bytes()).await)
}

/// An HTTP/2 (prior knowledge) connection to `addr`, driven by a task of its own: its sender.
pub(crate) async fn h2_sender(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}
