//! Protocol detection on the first bytes of a captured connection (addressing.md §3.1).
//!
//! Pure: a byte prefix in, a verdict out. The caller peeks more bytes while the verdict is
//! [`Verdict::NeedMore`] and the sniff bound has not run out.

use crate::prelude::*;

use crate::resolve::decision::Sniffed;

/// The HTTP/2 prior-knowledge preface.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The longest request line the sniffer waits for before calling the bytes "not HTTP".
pub const MAX_REQUEST_LINE: usize = 8192;

/// What a prefix is, so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Decided.
    Known(Sniffed),
    /// The prefix could still become HTTP or TLS: read more.
    NeedMore,
}

/// Classify a prefix. A TLS ClientHello's server name is extracted by the caller (it needs the
/// whole record); here a TLS record header is enough to say "TLS", with [`Verdict::NeedMore`]
/// until the record is complete.
pub fn sniff(prefix: &[u8]) -> Verdict {
    if prefix.is_empty() {
        return Verdict::NeedMore;
    }
    if prefix[0] == 0x16 {
        return sniff_tls(prefix);
    }
    if prefix.starts_with(H2_PREFACE) {
        return Verdict::Known(Sniffed::Http);
    }
    if H2_PREFACE.starts_with(prefix) {
        return Verdict::NeedMore;
    }
    sniff_http1(prefix)
}

fn sniff_tls(prefix: &[u8]) -> Verdict {
    // ContentType handshake, legacy version 3.x, then the length; the first handshake message
    // must be a ClientHello (1).
    if prefix.len() >= 2 && prefix[1] != 0x03 {
        return Verdict::Known(Sniffed::Other);
    }
    if prefix.len() >= 6 && prefix[5] != 0x01 {
        return Verdict::Known(Sniffed::Other);
    }
    if prefix.len() < 5 {
        return Verdict::NeedMore;
    }
    let len = usize::from(u16::from_be_bytes([prefix[3], prefix[4]]));
    if len == 0 {
        // No ClientHello in an empty record (TLS forbids empty handshake fragments); the
        // next byte would be the next record's, not a handshake type.
        return Verdict::Known(Sniffed::Other);
    }
    if prefix.len() < 5 + len {
        return Verdict::NeedMore;
    }
    Verdict::Known(Sniffed::Tls(client_hello_sni(&prefix[5..5 + len])))
}

/// The SNI host name of a ClientHello handshake message (the record payload), if any: lower
/// case, without a trailing dot.
pub fn client_hello_sni(msg: &[u8]) -> Option<String> {
    let mut r = Reader(msg);
    if r.u8()? != 1 {
        return None;
    }
    let body_len = r.u24()?;
    let body = r.take(body_len)?;
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    let session = usize::from(r.u8()?);
    r.take(session)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let compression = usize::from(r.u8()?);
    r.take(compression)?;
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let data = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(data);
        let list_len = usize::from(list.u16()?);
        let mut names = Reader(list.take(list_len)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name_len = usize::from(names.u16()?);
            let name = names.take(name_len)?;
            if name_type == 0 {
                // Written without a trailing dot (RFC 6066 §3); one that has it names the same
                // host, as a TLS server (rustls) reads it.
                let name = name.strip_suffix(b".").unwrap_or(name);
                return std::str::from_utf8(name).ok().map(str::to_ascii_lowercase);
            }
        }
    }
    None
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

/// The longest method the sniffer waits for before calling the bytes "not HTTP".
pub const MAX_METHOD: usize = 32;

/// An HTTP/1.x request line: `METHOD SP target SP HTTP/1.d CRLF`, method a token.
///
/// The bounds ([`MAX_REQUEST_LINE`], [`MAX_METHOD`]) hold whether or not the line is complete:
/// the caller stops peeking at the first `Known`, so the verdict on a prefix must be the
/// verdict on every longer input, however the bytes were cut into segments.
fn sniff_http1(prefix: &[u8]) -> Verdict {
    let line_end = prefix
        .iter()
        .take(MAX_REQUEST_LINE)
        .position(|&b| b == b'\n');
    let line = match line_end {
        Some(end) => &prefix[..end],
        None if prefix.len() >= MAX_REQUEST_LINE => return Verdict::Known(Sniffed::Other),
        None => prefix,
    };
    // The method: 1+ token characters followed by a space.
    let method_len = line.iter().take_while(|&&b| is_token(b)).count();
    if method_len == 0 || method_len > MAX_METHOD {
        return Verdict::Known(Sniffed::Other);
    }
    if method_len == line.len() {
        // Still inside the method (or a complete line without a space).
        return if line_end.is_some() {
            Verdict::Known(Sniffed::Other)
        } else {
            Verdict::NeedMore
        };
    }
    if line[method_len] != b' ' {
        return Verdict::Known(Sniffed::Other);
    }
    let Some(end) = line_end else {
        return Verdict::NeedMore;
    };
    let line = &prefix[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let version_ok = line.len() > method_len + 10
        && line.ends_with(b"HTTP/1.1") | line.ends_with(b"HTTP/1.0")
        && line[line.len() - 9] == b' '
        && line[method_len + 1..line.len() - 9]
            .iter()
            .all(|&b| b > b' ' && b != 0x7f);
    Verdict::Known(if version_ok {
        Sniffed::Http
    } else {
        Sniffed::Other
    })
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(bytes: &[u8]) -> Sniffed {
        match sniff(bytes) {
            Verdict::Known(s) => s,
            Verdict::NeedMore => panic!("undecided on {bytes:?}"),
        }
    }

    #[test]
    fn http_request_lines() {
        assert_eq!(known(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Sniffed::Http);
        assert_eq!(known(b"GET /x HTTP/1.0\r\n"), Sniffed::Http);
        assert_eq!(known(b"GET http://a.b:9090/x HTTP/1.1\r\n"), Sniffed::Http);
        assert_eq!(known(b"CONNECT a.b:80 HTTP/1.1\r\n"), Sniffed::Http);
        assert_eq!(known(H2_PREFACE), Sniffed::Http);
    }

    #[test]
    fn not_http() {
        // N8: a memcached-like line is not HTTP.
        assert_eq!(known(b"GET mykey\r\n"), Sniffed::Other);
        assert_eq!(known(b"hello\r\n\r\n"), Sniffed::Other);
        assert_eq!(known(b"\x00\x01"), Sniffed::Other);
        assert_eq!(known(b"ping\n"), Sniffed::Other);
        assert_eq!(known(b"GET / SPDY/3\r\n"), Sniffed::Other);
    }

    #[test]
    fn partial_prefixes_wait() {
        assert_eq!(sniff(b"GE"), Verdict::NeedMore);
        assert_eq!(sniff(b"GET /abc"), Verdict::NeedMore);
        assert_eq!(sniff(b"PRI * HT"), Verdict::NeedMore);
        assert_eq!(sniff(b"\x16\x03\x01"), Verdict::NeedMore);
    }

    /// The proxy stops peeking at the first `Known`, so a verdict must not depend on how the
    /// bytes were cut into segments: what a prefix decided, the whole says too. Found by the
    /// `sniff` fuzz target (tests/fuzz/corpus/sniff/long-method, long-request-line).
    #[test]
    fn a_verdict_is_the_same_however_the_bytes_arrive() {
        let long_method = format!("{} / HTTP/1.1\r\n\r\n", "G".repeat(33));
        let long_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_REQUEST_LINE));
        for whole in [long_method.as_bytes(), long_line.as_bytes()] {
            let mut first = None;
            for cut in 1..=whole.len() {
                if let Verdict::Known(v) = sniff(&whole[..cut]) {
                    first.get_or_insert((cut, v));
                }
            }
            let (cut, early) = first.expect("decided");
            assert_eq!(
                known(whole),
                early,
                "the first {cut} bytes were {early:?}, all {} bytes differ",
                whole.len()
            );
        }
    }

    /// A handshake record of length 0 holds no ClientHello (TLS forbids empty handshake
    /// fragments), and the byte after it belongs to the next record: "not TLS" however many
    /// bytes follow. Found by the `sniff` fuzz target (tests/fuzz/corpus/sniff/tls-empty-record).
    #[test]
    fn an_empty_handshake_record_is_not_tls() {
        assert_eq!(known(b"\x16\x03\x01\x00\x00"), Sniffed::Other);
        assert_eq!(known(b"\x16\x03\x01\x00\x00\x01\x00"), Sniffed::Other);
        assert_eq!(known(b"\x16\x03\x01\x00\x00\x16\x03"), Sniffed::Other);
    }

    /// An SNI is written without a trailing dot (RFC 6066 §3); one that has it names the same
    /// host, as rustls reads it, so that a TLSRoute's hostnames match it. Found by the
    /// `client_hello` fuzz target (rustls differential; corpus client_hello/sni-trailing-dot).
    #[test]
    fn a_trailing_dot_in_the_sni_is_dropped() {
        let hello = sample_client_hello("Echo.Example.");
        assert_eq!(
            client_hello_sni(&hello[5..]).as_deref(),
            Some("echo.example")
        );
        assert_eq!(known(&hello), Sniffed::Tls(Some("echo.example".into())));
    }

    #[test]
    fn tls_client_hello_with_sni() {
        let hello = sample_client_hello("Echo.Example");
        assert_eq!(known(&hello), Sniffed::Tls(Some("echo.example".into())));
        assert_eq!(sniff(&hello[..hello.len() - 1]), Verdict::NeedMore);
    }

    /// A minimal ClientHello record carrying one SNI extension.
    pub(crate) fn sample_client_hello(sni: &str) -> Vec<u8> {
        let name = sni.as_bytes();
        let mut ext = Vec::new();
        let list_len = 3 + name.len();
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&u16::try_from(2 + list_len).unwrap().to_be_bytes());
        ext.extend_from_slice(&u16::try_from(list_len).unwrap().to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
        ext.extend_from_slice(name);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&u16::try_from(ext.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![1];
        let len = body.len();
        msg.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&u16::try_from(msg.len()).unwrap().to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = sniff(&bytes);
            let _ = client_hello_sni(&bytes);
        }
    }
}
