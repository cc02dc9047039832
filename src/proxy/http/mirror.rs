//! `RequestMirror` (routes.md §4 item 4): copies of a delivered request, sent fire-and-forget
//! to each mirror that fires, as requests the mesh makes itself ([`crate::proxy::mesh_call`]).
//! A copy never delays or changes the client's request: its body is read for the copies only
//! up to the mirror body limit ([`ProxySettings::mirror_max_body_bytes`](crate::proxy::ProxySettings::mirror_max_body_bytes)) (and, of unknown length, for at most [`MIRROR_BODY_WAIT`]), then
//! replayed whole to the delivery.
//!
//! May import: `mesh_call`, `respond`; never `super::serve`, `super::deliver` or the filters.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{Request, Version};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Body as _, Frame};
use tracing::{debug, info, warn};

use crate::model::filters::{MirrorStep, mirror_fires};
use crate::proxy::mesh_call::{MeshCallError, mesh_send};
use crate::proxy::{Body, BoxError, Inputs, PodCtx, count, respond};
use crate::resolve::decision::Delivery;

/// How long a mirror copy may take, answer included; it never delays the client.
pub const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the body of a request of unknown length is awaited for its copies before the
/// copies are given up (a streaming request must not wait on its own mirror).
pub const MIRROR_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The rule's and the chosen backend's mirrors that fire for this request ([`mirror_fires`],
/// each on its own entropy).
pub(super) fn fired_mirrors(d: &Delivery) -> Vec<MirrorStep> {
    let Some(run) = &d.route else {
        return Vec::new();
    };
    let backend = run.plan.backends.get(run.backend_index);
    run.plan
        .mirrors
        .iter()
        .chain(backend.into_iter().flat_map(|b| b.mirrors.iter()))
        .filter(|m| mirror_fires(m.0.percent, fastrand::u64(..)))
        .cloned()
        .collect()
}

/// Send a copy of `req` to each mirror, fire-and-forget, and give back the request to deliver
/// (its body replayed when it was read for the copies). A copy is not sent, logged and counted,
/// when the request switches protocols or its body is over the mirror body limit (or of
/// unknown length and slower than [`MIRROR_BODY_WAIT`]).
pub(super) async fn send_mirrors(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    d: &Delivery,
    mirrors: Vec<MirrorStep>,
    req: Request<Body>,
    upgrade: bool,
) -> Request<Body> {
    let skip = |why: &str| {
        for m in &mirrors {
            info!(pod = %pod.name, mirror = %m, why, "request not mirrored");
            count(&inputs.stats.mirror_skipped);
        }
    };
    if upgrade {
        skip("the request switches protocols");
        return req;
    }
    let (parts, body) = req.into_parts();
    let (body, copy) = buffer_body(
        body,
        inputs.settings.mirror_max_body_bytes,
        MIRROR_BODY_WAIT,
    )
    .await;
    let Some(copy) = copy else {
        skip("the body is over the mirror limit or did not arrive in time");
        return Request::from_parts(parts, body);
    };
    let namespace = d
        .rule
        .as_ref()
        .map_or(pod.namespace.as_str(), |r| &*r.namespace)
        .to_owned();
    for m in mirrors {
        let Some(authority) = mirror_authority(&m, &namespace, &inputs.settings.mesh_domain) else {
            warn!(pod = %pod.name, mirror = %m, "mirror is not a Service with a port");
            count(&inputs.stats.mirror_failures);
            continue;
        };
        let mut builder = Request::builder()
            .method(parts.method.clone())
            .uri(parts.uri.clone())
            .version(Version::HTTP_11);
        for (k, v) in &parts.headers {
            if !is_hop_by_hop(k) {
                builder = builder.header(k, v);
            }
        }
        let Ok(copy) = builder.body(respond::full(copy.clone())) else {
            count(&inputs.stats.mirror_failures);
            continue;
        };
        count(&inputs.stats.mirrors);
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(MIRROR_TIMEOUT, async {
                let resp = mesh_send(&inputs, &pod, &authority, copy).await?;
                let status = resp.status();
                // The answer is read and discarded, so the copy completes at the mirror.
                let _ = resp.into_body().collect().await;
                Ok::<_, MeshCallError>(status)
            })
            .await;
            match sent {
                Ok(Ok(status)) => debug!(%authority, %status, "mirror answered"),
                Ok(Err(e)) => {
                    warn!(pod = %pod.name, %authority, error = %crate::DisplayChain(&e),
                        "mirror failed");
                    count(&inputs.stats.mirror_failures);
                }
                Err(_) => {
                    warn!(pod = %pod.name, %authority, "mirror timed out");
                    count(&inputs.stats.mirror_failures);
                }
            }
        });
    }
    Request::from_parts(parts, body)
}

/// The mesh name and port a mirror is sent to (`<svc>.<ns>.<mesh-domain>:<port>`); `None`
/// unless it names a core Service with a port.
fn mirror_authority(m: &MirrorStep, namespace: &str, mesh_domain: &str) -> Option<String> {
    let target = &m.0.backend;
    if !target.group.is_empty() || target.kind != "Service" {
        return None;
    }
    let port = m.0.port?;
    let ns = target.namespace.as_deref().unwrap_or(namespace);
    Some(format!("{}.{ns}.{mesh_domain}:{port}", target.name))
}

/// Connection-specific fields, which a copy sent over HTTP/2 does not carry.
fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    name == CONNECTION
        || name == TE
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Read `body` for a copy, up to `limit` bytes and, when its length is not known in advance,
/// for at most `wait`. Returns the body to send on (the frames read, replayed, then the rest)
/// and the copy's bytes, `None` when the body is over the limit, late, or broken.
async fn buffer_body(
    mut body: Body,
    limit: usize,
    wait: std::time::Duration,
) -> (Body, Option<Bytes>) {
    if body.is_end_stream() {
        return (body, Some(Bytes::new()));
    }
    let hint = body.size_hint();
    let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if hint.lower() > limit64 {
        return (body, None);
    }
    let known = hint.upper().is_some();
    // tokio's clock, so that a test with a paused clock sees the bound exactly.
    let deadline = tokio::time::Instant::now() + wait;
    let mut frames: Vec<Frame<Bytes>> = Vec::new();
    let mut data = BytesMut::new();
    loop {
        let next = if known {
            Ok(body.frame().await)
        } else {
            tokio::time::timeout_at(deadline, body.frame()).await
        };
        match next {
            Ok(None) => return (replay(frames, None, None), Some(data.freeze())),
            Ok(Some(Ok(frame))) => {
                if let Some(chunk) = frame.data_ref() {
                    data.extend_from_slice(chunk);
                }
                frames.push(frame);
                if data.len() > limit {
                    return (replay(frames, None, Some(body)), None);
                }
            }
            // The client's body broke: the delivery sees the same error.
            Ok(Some(Err(e))) => return (replay(frames, Some(e), None), None),
            Err(_) => return (replay(frames, None, Some(body)), None),
        }
    }
}

/// A body of the `frames` already read, then `error` or the `rest`.
fn replay(frames: Vec<Frame<Bytes>>, error: Option<BoxError>, rest: Option<Body>) -> Body {
    use futures_util::StreamExt;
    let read = futures_util::stream::iter(
        frames
            .into_iter()
            .map(Ok::<_, BoxError>)
            .chain(error.map(Err)),
    );
    match rest {
        Some(rest) => BodyExt::boxed(StreamBody::new(read.chain(BodyStream::new(rest)))),
        None => BodyExt::boxed(StreamBody::new(read)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::snapshot::{Mirror, ObjectRef};

    fn chunks(parts: &[&'static [u8]]) -> (Body, tokio::sync::mpsc::Sender<&'static [u8]>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<&'static [u8]>(16);
        for p in parts {
            tx.try_send(p).unwrap();
        }
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(chunk))),
                rx,
            ))
        });
        (BodyExt::boxed(StreamBody::new(stream)), tx)
    }

    async fn all(body: Body) -> Bytes {
        body.collect().await.expect("the body").to_bytes()
    }

    #[tokio::test]
    async fn a_body_under_the_limit_is_copied_and_still_delivered_whole() {
        let body = respond::full("name=value&x=1");
        let (body, copy) = buffer_body(body, 64, Duration::from_secs(1)).await;
        assert_eq!(copy.as_deref(), Some(&b"name=value&x=1"[..]));
        assert_eq!(all(body).await, "name=value&x=1");
        let (body, copy) = buffer_body(respond::empty(), 64, Duration::from_secs(1)).await;
        assert_eq!(copy.as_deref(), Some(&b""[..]));
        assert_eq!(all(body).await, "");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_not_copied_and_is_delivered_whole() {
        // Known length over the limit: not even read.
        let (body, copy) = buffer_body(respond::full("0123456789"), 4, Duration::ZERO).await;
        assert!(copy.is_none());
        assert_eq!(all(body).await, "0123456789");
        // Unknown length: read until over, then replayed ahead of the rest.
        let (body, tx) = chunks(&[b"abc", b"def", b"ghi"]);
        drop(tx);
        let (body, copy) = buffer_body(body, 4, Duration::from_secs(1)).await;
        assert!(copy.is_none());
        assert_eq!(all(body).await, "abcdefghi");
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_body_is_not_waited_for_beyond_the_bound() {
        let (body, tx) = chunks(&[b"first "]);
        let started = tokio::time::Instant::now();
        let (body, copy) = buffer_body(body, 1024, Duration::from_millis(50)).await;
        assert!(copy.is_none(), "the copy is given up");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(50),
            "given up at the bound"
        );
        tx.send(b"second").await.unwrap();
        drop(tx);
        assert_eq!(all(body).await, "first second");
    }

    fn mirror(group: &str, kind: &str, ns: Option<&str>, port: Option<u16>) -> MirrorStep {
        MirrorStep(Mirror {
            backend: ObjectRef {
                group: group.into(),
                kind: kind.into(),
                namespace: ns.map(Into::into),
                name: "mp-authz".into(),
            },
            port,
            percent: 100,
        })
    }

    #[test]
    fn a_mirror_is_sent_to_the_mesh_name_of_its_service() {
        let d = "aether.internal";
        assert_eq!(
            mirror_authority(&mirror("", "Service", None, Some(9191)), "mp", d).as_deref(),
            Some("mp-authz.mp.aether.internal:9191")
        );
        assert_eq!(
            mirror_authority(&mirror("", "Service", Some("audit"), Some(80)), "mp", d).as_deref(),
            Some("mp-authz.audit.aether.internal:80")
        );
        assert_eq!(
            mirror_authority(&mirror("", "Service", None, None), "mp", d),
            None
        );
        assert_eq!(
            mirror_authority(&mirror("example.com", "Backend", None, Some(80)), "mp", d),
            None
        );
    }
}
