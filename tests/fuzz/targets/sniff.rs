//! `sniff`: protocol detection on the first bytes of a captured connection
//! (crates/aether-core/src/proxy/sniff.rs, addressing.md §3.1).
//!
//! Properties, beyond "no panic":
//! - a verdict is final: when a prefix of the bytes is `Known(x)`, the whole is `Known(x)` too
//!   (the proxy stops peeking at the first `Known`, so the verdict must not depend on how the
//!   bytes were cut into segments);
//! - the sniffer never waits forever: past the longest request line and the longest TLS record,
//!   the verdict is `Known`, and only a TLS record header (0x16) waits past 8 KiB;
//! - a TLS verdict carries the ClientHello's SNI as `client_hello_sni` reads it.

use aether::proxy::sniff::{MAX_REQUEST_LINE, Verdict, client_hello_sni, sniff};
use aether::resolve::decision::Sniffed;

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "sniff",
    max_len: 2 * MAX_REQUEST_LINE + 64,
    dict: &[
        b"GET ",
        b"POST ",
        b"CONNECT ",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"PRI * HT",
        b" HTTP/1.1\r\n",
        b" HTTP/1.0\r\n",
        b" HTTP/1.1",
        b"HTTP/1.",
        b" / ",
        b"Host: ",
        b"\x16\x03\x01\x00",
        b"\x16\x03\x03",
        b"\x01\x00\x00",
        b"\x00\x00",
        b"\x7f",
    ],
    run,
};

/// Where the prefix property cuts the input: every length for short inputs, else a spread.
fn cuts(len: usize) -> Vec<usize> {
    if len <= 48 {
        return (0..len).collect();
    }
    let mut v: Vec<usize> = (0..16)
        .chain([5, 6, MAX_REQUEST_LINE - 1, MAX_REQUEST_LINE])
        .collect();
    v.extend((1..32).map(|k| len * k / 32));
    v.retain(|&c| c < len);
    v.sort_unstable();
    v.dedup();
    v
}

fn run(input: &[u8]) -> u64 {
    let whole = sniff(input);
    for cut in cuts(input.len()) {
        if let Verdict::Known(early) = sniff(&input[..cut]) {
            assert_eq!(
                whole,
                Verdict::Known(early.clone()),
                "the first {cut} bytes were already {early:?}, but all {} bytes are {whole:?}: \
                 the verdict depends on how the bytes arrive",
                input.len()
            );
        }
    }
    let first_is_tls = input.first() == Some(&0x16);
    if whole == Verdict::NeedMore {
        assert!(
            input.len() < MAX_REQUEST_LINE || (first_is_tls && input.len() < 5 + 0xffff),
            "still NeedMore after {} bytes",
            input.len()
        );
    }
    if let Verdict::Known(Sniffed::Tls(sni)) = &whole {
        let len = usize::from(u16::from_be_bytes([input[3], input[4]]));
        assert_eq!(*sni, client_hello_sni(&input[5..5 + len]));
    }
    outcome(&whole)
}
