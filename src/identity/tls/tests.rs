//! Handshakes over in-memory pipes between workloads of one or two CAs and trust domains.

use std::io;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};

use super::*;
use crate::identity::{Ca, IdentitySettings};

const H2: &[u8] = b"h2";

fn ca() -> Arc<Ca> {
    Arc::new(Ca::generate(crate::time::wall()).unwrap())
}

fn identities(ca: &Arc<Ca>, trust_domain: &str) -> Arc<Identities> {
    let settings = IdentitySettings {
        trust_domain: trust_domain.to_owned(),
        ..IdentitySettings::default()
    };
    Arc::new(Identities::new(Arc::clone(ca), settings).unwrap())
}

struct Outcome {
    server: io::Result<server::TlsStream<DuplexStream>>,
    client: io::Result<client::TlsStream<DuplexStream>>,
}

async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> Outcome {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let accept = TlsAcceptor::from(server).accept(s);
    let connect = TlsConnector::from(client).connect(name, c);
    let (server, client) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(accept, connect)
    })
    .await
    .expect("the handshake ends");
    Outcome { server, client }
}

fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// Whether a client that completed its half of the handshake can still exchange data (in
/// TLS 1.3 the server judges the client certificate after the client's Finished).
async fn exchange(
    client: &mut client::TlsStream<DuplexStream>,
    server: Option<&mut server::TlsStream<DuplexStream>>,
) -> bool {
    if client.write_all(b"ping").await.is_err() || client.flush().await.is_err() {
        return false;
    }
    if let Some(server) = server {
        let mut buf = [0u8; 4];
        if server.read_exact(&mut buf).await.is_err() {
            return false;
        }
        return server.write_all(b"pong").await.is_ok() && server.flush().await.is_ok() && {
            let mut got = [0u8; 4];
            client.read_exact(&mut got).await.is_ok() && &got == b"pong"
        };
    }
    let mut got = [0u8; 1];
    matches!(client.read(&mut got).await, Ok(n) if n > 0)
}

#[tokio::test]
async fn two_workloads_handshake_and_each_sees_the_others_spiffe_id() {
    let ca = ca();
    let ids = identities(&ca, "cluster.local");
    let server = server_config(&ids, "mp", "mp-multi", &[H2]).unwrap();
    let client = client_config(&ids, "mp", "mp-client", &[H2]).unwrap();
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();

    let out = handshake(server, client, name).await;
    let mut s = out.server.expect("the server accepts");
    let mut c = out.client.expect("the client connects");

    let (_, server_side) = s.get_ref();
    assert_eq!(server_side.alpn_protocol(), Some(H2));
    let caller = ids
        .peer_identity(server_side.peer_certificates().unwrap())
        .unwrap();
    assert_eq!(
        caller.to_string(),
        "spiffe://cluster.local/ns/mp/sa/mp-client"
    );
    let (_, client_side) = c.get_ref();
    let callee = ids
        .peer_identity(client_side.peer_certificates().unwrap())
        .unwrap();
    assert_eq!(
        callee.to_string(),
        "spiffe://cluster.local/ns/mp/sa/mp-multi"
    );
    assert!(exchange(&mut c, Some(&mut s)).await, "data flows both ways");
}

#[tokio::test]
async fn workload_certificates_of_a_ca_key_of_every_form_and_kind_verify_on_the_hop() {
    use x509_parser::oid_registry::{
        OID_PKCS1_SHA256WITHRSA, OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384,
        OID_SIG_ED25519,
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ca-keys");
    for (name, signed_with) in [
        ("p256-pkcs8", OID_SIG_ECDSA_WITH_SHA256),
        ("p256-sec1", OID_SIG_ECDSA_WITH_SHA256),
        ("p384-pkcs8", OID_SIG_ECDSA_WITH_SHA384),
        ("p384-sec1", OID_SIG_ECDSA_WITH_SHA384),
        ("rsa-pkcs8", OID_PKCS1_SHA256WITHRSA),
        ("rsa-pkcs1", OID_PKCS1_SHA256WITHRSA),
        ("ed25519-pkcs8", OID_SIG_ED25519),
    ] {
        let ca = Ca::load(
            &dir.join(format!("{name}.crt.pem")),
            &dir.join(format!("{name}.key.pem")),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids = identities(&Arc::new(ca), "cluster.local");
        let leaf = ids
            .certificate("mp", "mp-multi", crate::time::wall())
            .unwrap();
        let (_, x509) = x509_parser::parse_x509_certificate(leaf.leaf()).unwrap();
        assert_eq!(x509.signature_algorithm.algorithm, signed_with, "{name}");

        let server = server_config(&ids, "mp", "mp-multi", &[H2]).unwrap();
        let client = client_config(&ids, "mp", "mp-client", &[H2]).unwrap();
        let out = handshake(
            server,
            client,
            ids.server_name(8080, "mp-multi", "mp").unwrap(),
        )
        .await;
        let mut s = out
            .server
            .unwrap_or_else(|e| panic!("{name}: the server refused: {e}"));
        let mut c = out
            .client
            .unwrap_or_else(|e| panic!("{name}: the client refused: {e}"));
        let caller = ids
            .peer_identity(s.get_ref().1.peer_certificates().unwrap())
            .unwrap();
        assert_eq!(
            caller.to_string(),
            "spiffe://cluster.local/ns/mp/sa/mp-client",
            "{name}"
        );
        assert!(exchange(&mut c, Some(&mut s)).await, "{name}: data flows");
    }
}

#[tokio::test]
async fn a_client_certificate_of_another_ca_is_refused_by_the_server() {
    let ids = identities(&ca(), "cluster.local");
    let stranger = identities(&ca(), "cluster.local");
    let server = server_config(&ids, "mp", "mp-multi", &[]).unwrap();
    // The stranger trusts our CA (so it accepts the server) but presents its own CA's cert.
    let client = Arc::new(
        ClientConfig::builder_with_provider(Arc::clone(ids.provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(&ids).unwrap())
            .with_client_cert_resolver(Arc::new(WorkloadResolver::new(
                &stranger,
                "mp",
                "mp-client",
            ))),
    );
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();

    let out = handshake(server, client, name).await;
    let err = out.server.expect_err("the server refuses the client");
    assert!(
        matches!(
            rustls_error(&err),
            Some(rustls::Error::InvalidCertificate(_))
        ),
        "{err:?}"
    );
    if let Ok(mut c) = out.client {
        assert!(!exchange(&mut c, None).await, "no data after a refusal");
    }
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused_by_the_server() {
    let ids = identities(&ca(), "cluster.local");
    let server = server_config(&ids, "mp", "mp-multi", &[]).unwrap();
    let client = Arc::new(
        ClientConfig::builder_with_provider(Arc::clone(ids.provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(&ids).unwrap())
            .with_no_client_auth(),
    );
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();
    let out = handshake(server, client, name).await;
    assert!(
        out.server.is_err(),
        "the server requires a client certificate"
    );
}

#[tokio::test]
async fn a_server_certificate_for_another_service_fails_the_clients_name_check() {
    let ids = identities(&ca(), "cluster.local");
    let server = server_config(&ids, "mp", "mp-nine", &[]).unwrap();
    let client = client_config(&ids, "mp", "mp-client", &[]).unwrap();
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();

    let out = handshake(server, client, name).await;
    let err = out.client.expect_err("the client refuses the server");
    assert!(
        matches!(
            rustls_error(&err),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{err:?}"
    );
    assert!(out.server.is_err());
}

#[tokio::test]
async fn the_same_service_in_another_namespace_fails_the_name_check() {
    let ids = identities(&ca(), "cluster.local");
    let server = server_config(&ids, "mp-other", "mp-multi", &[]).unwrap();
    let client = client_config(&ids, "mp", "mp-client", &[]).unwrap();
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();
    let out = handshake(server, client, name).await;
    assert!(out.client.is_err());
}

#[tokio::test]
async fn a_peer_of_another_trust_domain_is_rejected_even_under_the_same_ca() {
    let ca = ca();
    let ours = identities(&ca, "cluster.local");
    let theirs = identities(&ca, "other.example");
    let server = server_config(&ours, "mp", "mp-multi", &[]).unwrap();
    let client = client_config(&theirs, "mp", "mp-client", &[]).unwrap();
    let name = ours.server_name(9090, "mp-multi", "mp").unwrap();

    let out = handshake(server, client, name).await;
    let s = out.server.expect("the chain itself is valid");
    out.client.expect("the chain itself is valid");
    let err = ours
        .peer_identity(s.get_ref().1.peer_certificates().unwrap())
        .unwrap_err();
    match err {
        IdentityError::ForeignTrustDomain { expected, got } => {
            assert_eq!(
                (expected.as_str(), got.as_str()),
                ("cluster.local", "other.example")
            );
        }
        other => panic!("expected a foreign trust domain, got {other}"),
    }
}

#[tokio::test]
async fn after_rotation_handshakes_present_the_new_certificate() {
    let ca = ca();
    let settings = IdentitySettings {
        validity: Duration::from_secs(600),
        ..IdentitySettings::default()
    };
    let ids = Arc::new(Identities::new(Arc::clone(&ca), settings).unwrap());
    let server = server_config(&ids, "mp", "mp-multi", &[]).unwrap();
    let client = client_config(&ids, "mp", "mp-client", &[]).unwrap();
    let name = ids.server_name(9090, "mp-multi", "mp").unwrap();

    let first = handshake(Arc::clone(&server), Arc::clone(&client), name.clone()).await;
    let before = first
        .client
        .unwrap()
        .get_ref()
        .1
        .peer_certificates()
        .unwrap()[0]
        .clone();

    // 600 s validity plus 300 s backdate: the half-life is 150 s after issue.
    let rotated = ids.rotate_due(crate::time::wall() + Duration::from_secs(200));
    assert_eq!(rotated, 2, "the server's and the client's certificates");

    let second = handshake(server, client, name).await;
    let s = second.server.expect("the server still accepts");
    let c = second.client.expect("the client still connects");
    let after = c.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_ne!(
        before, after,
        "the server presents the re-issued certificate"
    );
    let current = ids
        .certificate("mp", "mp-multi", crate::time::wall())
        .unwrap();
    assert_eq!(&after, current.leaf());
    let caller = ids
        .peer_identity(s.get_ref().1.peer_certificates().unwrap())
        .unwrap();
    assert_eq!(caller.service_account, "mp-client");
}

#[test]
fn peer_identity_refuses_an_empty_chain_and_garbage() {
    assert!(matches!(
        peer_identity("cluster.local", &[]),
        Err(IdentityError::NoPeerCertificate)
    ));
    let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02, 0x03]);
    assert!(matches!(
        peer_identity("cluster.local", &[junk]),
        Err(IdentityError::UnparsablePeerCertificate)
    ));
}

#[test]
fn peer_identity_refuses_a_certificate_without_a_uri_san() {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["x.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    assert!(matches!(
        peer_identity("cluster.local", &[cert.der().clone()]),
        Err(IdentityError::UriSanCount { count: 0 })
    ));
}
