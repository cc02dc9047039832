//! `client_hello`: the SNI reader of a TLS ClientHello (crates/aether-core/src/proxy/sniff.rs
//! `client_hello_sni`), fed the handshake message (a record's payload).
//!
//! Properties, beyond "no panic":
//! - inside a record, `sniff` says TLS with the same SNI (or "not TLS" when the message is not
//!   a ClientHello);
//! - the name is lower case, and a ClientHello built around it reads back the same name (less
//!   a trailing dot, which the reader drops);
//! - differential: when rustls accepts the same record as a ClientHello with a server name,
//!   the reader finds that name (the SNI a TLSRoute and the mesh hop are chosen by is the one
//!   a TLS server would see).

use aether::proxy::sniff::{Verdict, client_hello_sni, sniff};
use aether::resolve::decision::Sniffed;

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "client_hello",
    max_len: 0xffff,
    dict: &[
        b"\x01\x00\x00",
        b"\x03\x03",
        b"\x03\x01",
        b"\x00\x00",
        b"\x00\x00\x00\x0e\x00\x0c\x00\x00\x09",
        b"\x00\x2b\x00\x03\x02\x03\x04",
        b"\x00\x0a\x00\x04\x00\x02\x00\x1d",
        b"\x00\x0d\x00\x04\x00\x02\x08\x04",
        b"\x00\x33",
        b"\x13\x01",
        b"\x01\x00",
        b"\xff\xff",
        b"echo.example",
        b"mp-multi.mp.aether.internal",
    ],
    run,
};

/// A TLS record (handshake, legacy version 3.1) around `msg`.
pub(crate) fn record(msg: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(msg.len()).ok()?;
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&len.to_be_bytes());
    rec.extend_from_slice(msg);
    Some(rec)
}

/// A minimal ClientHello message carrying one SNI extension with `name`.
fn hello(name: &[u8]) -> Option<Vec<u8>> {
    let n = u16::try_from(name.len()).ok()?;
    let mut ext = Vec::new();
    ext.extend_from_slice(&0u16.to_be_bytes());
    ext.extend_from_slice(&(n.checked_add(5)?).to_be_bytes());
    ext.extend_from_slice(&(n.checked_add(3)?).to_be_bytes());
    ext.push(0);
    ext.extend_from_slice(&n.to_be_bytes());
    ext.extend_from_slice(name);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&u16::try_from(ext.len()).ok()?.to_be_bytes());
    body.extend_from_slice(&ext);
    let len = u32::try_from(body.len()).ok()?;
    let mut msg = vec![1];
    msg.extend_from_slice(&len.to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    Some(msg)
}

/// The server name rustls reads from the record when it accepts it as a ClientHello, or why
/// it does not (its error, the outcome's signature).
fn rustls_sni(rec: &[u8]) -> Result<Option<String>, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    acceptor
        .read_tls(&mut &rec[..])
        .map_err(|e| format!("read: {:?}", e.kind()))?;
    match acceptor.accept() {
        Ok(Some(accepted)) => Ok(accepted.client_hello().server_name().map(str::to_owned)),
        Ok(None) => Err("incomplete".to_owned()),
        Err((e, _alert)) => Err(format!("{e:?}")),
    }
}

fn run(msg: &[u8]) -> u64 {
    let sni = client_hello_sni(msg);
    if let Some(name) = &sni {
        assert_eq!(
            *name,
            name.to_ascii_lowercase(),
            "the SNI is not lower case"
        );
        // The reader drops one trailing dot: a name that still ends in one loses it again.
        if let Some(again) = hello(name.as_bytes()) {
            let expected = name.strip_suffix('.').unwrap_or(name);
            assert_eq!(
                client_hello_sni(&again).as_deref(),
                Some(expected),
                "re-encoded"
            );
        }
    }
    let mut theirs = Err(String::new());
    if let Some(rec) = record(msg) {
        // An empty record is no ClientHello; one whose type is not ClientHello (1) is not TLS.
        let expected = match msg.first() {
            Some(1) => Sniffed::Tls(sni.clone()),
            None | Some(_) => Sniffed::Other,
        };
        assert_eq!(
            sniff(&rec),
            Verdict::Known(expected),
            "the record's verdict"
        );
        theirs = rustls_sni(&rec);
        if let Ok(Some(name)) = &theirs {
            assert_eq!(
                sni,
                Some(name.to_ascii_lowercase()),
                "rustls reads the server name {name:?} from this ClientHello"
            );
        }
    }
    outcome(&(sni.is_some(), theirs.map(|n| n.is_some())))
}
