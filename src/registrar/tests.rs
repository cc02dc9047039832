//! The registrar against a scripted API server (`tower-test`) that keeps Leases and Services
//! as the real one does for these requests: create answers `409` when the object exists,
//! replace answers `409` when the resourceVersion precondition fails.

use std::collections::BTreeMap;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

use super::plan::tests::desired;
use super::*;

/// One object store with a resourceVersion counter, and the writes it saw.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    version: u64,
    /// `<METHOD> <path>?<query>` of every write.
    writes: Vec<String>,
}

fn status(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
        "reason": reason, "message": reason, "code": code});
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string().into_bytes()))
        .unwrap()
}

impl Server {
    async fn answer(&mut self, req: Request<Body>) -> Response<Body> {
        use http_body_util::BodyExt;
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        if method != Method::GET {
            self.writes.push(format!("{method} {path}?{query}"));
        }
        let item = |path: &str| path.to_owned();
        match method {
            Method::GET => match self.objects.get(&path) {
                Some(v) => ok(v),
                None => status(404, "NotFound"),
            },
            Method::POST => {
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                let name = v["metadata"]["name"].as_str().unwrap().to_owned();
                let key = item(&format!("{path}/{name}"));
                if self.objects.contains_key(&key) {
                    return status(409, "AlreadyExists");
                }
                self.version += 1;
                v["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.objects.insert(key, v.clone());
                ok(&v)
            }
            Method::PUT => {
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                let Some(have) = self.objects.get(&path) else {
                    return status(404, "NotFound");
                };
                if v["metadata"]["resourceVersion"] != have["metadata"]["resourceVersion"] {
                    return status(409, "Conflict");
                }
                self.version += 1;
                v["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.objects.insert(path, v.clone());
                ok(&v)
            }
            Method::PATCH => {
                // Server-side apply: the applied object replaces the stored one here.
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                self.version += 1;
                v["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.objects.insert(path, v.clone());
                ok(&v)
            }
            Method::DELETE => match self.objects.remove(&path) {
                Some(v) => ok(&v),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        }
    }
}

/// The server holds the registrar Lease: `holder`'s, at `rv`, after `transitions` handovers.
async fn held_lease(
    server: &Arc<tokio::sync::Mutex<Server>>,
    holder: &str,
    rv: &str,
    transitions: u32,
) {
    server.lock().await.objects.insert(
        LEASE_PATH.into(),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "aether-registrar", "namespace": "aether-system", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions}}),
    );
}

/// A client whose requests the shared server answers.
fn client(server: &Arc<tokio::sync::Mutex<Server>>) -> Client {
    let server = server.clone();
    crate::test_util::kube_mock::client(move |req| {
        let server = server.clone();
        async move { server.lock().await.answer(req).await }
    })
}

fn settings(identity: &str) -> RegistrarSettings {
    RegistrarSettings {
        namespace: "aether-system".into(),
        lease_name: LEASE_NAME.into(),
        identity: identity.into(),
        timing: LeaseTiming::default(),
    }
}

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/aether-system/leases/aether-registrar";

#[tokio::test]
async fn of_two_claimants_of_a_missing_lease_exactly_one_leads() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    let (ca, cb) = (client(&server), client(&server));
    let (sa, sb) = (settings("node-a-1"), settings("node-b-2"));
    let (la, lb): (Api<Lease>, Api<Lease>) = (
        Api::namespaced(ca, &sa.namespace),
        Api::namespaced(cb, &sb.namespace),
    );
    let mut a = Elector::new(sa.identity.clone(), sa.timing);
    let mut b = Elector::new(sb.identity.clone(), sb.timing);
    let now = Duration::from_secs(1);
    let (ra, rb) = tokio::join!(elect(&la, &sa, &mut a, now), elect(&lb, &sb, &mut b, now));
    for (r, e) in [(ra, &mut a), (rb, &mut b)] {
        if let Err(err) = r {
            assert!(err.is_conflict(), "{err}");
            e.failed(true);
        }
    }
    assert_eq!(
        [a.is_leader(now), b.is_leader(now)]
            .iter()
            .filter(|l| **l)
            .count(),
        1
    );
    let holder = server.lock().await.objects[LEASE_PATH]["spec"]["holderIdentity"].clone();
    let leader = if a.is_leader(now) {
        "node-a-1"
    } else {
        "node-b-2"
    };
    assert_eq!(holder, json!(leader));
}

#[tokio::test]
async fn of_two_claimants_of_an_expired_lease_the_fence_lets_exactly_one_take_it() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    held_lease(&server, "node-c-9", "4", 2).await;
    let (sa, sb) = (settings("node-a-1"), settings("node-b-2"));
    let la: Api<Lease> = Api::namespaced(client(&server), &sa.namespace);
    let lb: Api<Lease> = Api::namespaced(client(&server), &sb.namespace);
    let mut a = Elector::new(sa.identity.clone(), sa.timing);
    let mut b = Elector::new(sb.identity.clone(), sb.timing);
    // Both see node-c's Lease at t=0 and follow it.
    let t0 = Duration::ZERO;
    elect(&la, &sa, &mut a, t0).await.unwrap();
    elect(&lb, &sb, &mut b, t0).await.unwrap();
    assert!(!a.is_leader(t0) && !b.is_leader(t0));
    // node-c stopped renewing; at t=16 s both try to take it with resourceVersion 4.
    let t = Duration::from_secs(16);
    let (ra, rb) = tokio::join!(elect(&la, &sa, &mut a, t), elect(&lb, &sb, &mut b, t));
    let mut conflicts = 0;
    for (r, e) in [(ra, &mut a), (rb, &mut b)] {
        if let Err(err) = r {
            assert!(err.is_conflict(), "{err}");
            conflicts += 1;
            e.failed(true);
        }
    }
    let leaders = [a.is_leader(t), b.is_leader(t)];
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "{leaders:?}");
    let lease = server.lock().await.objects[LEASE_PATH].clone();
    assert_eq!(lease["spec"]["leaseTransitions"], json!(3));
    // The loser either conflicted or (if it read after the winner wrote) follows the winner.
    let loser = if leaders[0] { &mut b } else { &mut a };
    let loser_settings = if leaders[0] { &sb } else { &sa };
    let loser_api = if leaders[0] { &lb } else { &la };
    elect(loser_api, loser_settings, loser, t).await.unwrap();
    assert!(!loser.is_leader(t));
    assert!(conflicts <= 1);
}

#[tokio::test(start_paused = true)]
async fn only_the_leader_writes_and_it_applies_under_its_field_manager() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    // node-z holds the Lease: the registrar follows and writes nothing.
    held_lease(&server, "node-z", "1", 0).await;
    let input = Arc::new(RegistrarInput {
        desired: vec![desired("cart", &[(8080, "http")])],
        existing: Vec::new(),
        filters: Vec::new(),
    });
    let (tx, state, task) = start(&server, input);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!state.leader.load(Ordering::Acquire));
    assert!(
        server
            .lock()
            .await
            .writes
            .iter()
            .all(|w| !w.contains("/services/")),
        "a follower wrote a Service"
    );
    // node-z stops renewing: after the lease duration this daemon takes over and applies.
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(state.leader.load(Ordering::Acquire));
    let s = server.lock().await;
    let applies: Vec<&String> = s
        .writes
        .iter()
        .filter(|w| w.starts_with("PATCH /api/v1/namespaces/shop/services/cart"))
        .collect();
    assert_eq!(applies.len(), 1, "{:?}", s.writes);
    assert!(
        applies[0].contains("fieldManager=aether-registrar"),
        "{}",
        applies[0]
    );
    assert!(applies[0].contains("force=true"), "{}", applies[0]);
    let svc = &s.objects["/api/v1/namespaces/shop/services/cart"];
    assert_eq!(
        svc["metadata"]["labels"]["aether.io/mesh-service"],
        json!("true")
    );
    drop(s);
    drop(tx);
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_stops_releases_the_lease_and_the_next_takes_it_without_waiting_it_out() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    let (tx, state, task) = start_as(&server, Arc::default(), "node-a-1");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(state.leader.load(Ordering::Acquire));
    // The daemon stops: its registrar gives the Lease up before it ends.
    drop(tx);
    task.await.unwrap();
    assert!(!state.leader.load(Ordering::Acquire));
    let lease = server.lock().await.objects[LEASE_PATH].clone();
    assert_eq!(lease["spec"].get("holderIdentity"), None, "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], json!(1));
    // The next claimant leads at its first read, far within the 15 s lease duration.
    let (tx, state, task) = start_as(&server, Arc::default(), "node-b-2");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(state.leader.load(Ordering::Acquire));
    let lease = server.lock().await.objects[LEASE_PATH].clone();
    assert_eq!(lease["spec"]["holderIdentity"], json!("node-b-2"));
    assert_eq!(lease["spec"]["leaseTransitions"], json!(1));
    drop(tx);
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_stops_leaves_the_leaders_lease_alone() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    held_lease(&server, "node-z", "1", 0).await;
    let (tx, state, task) = start_as(&server, Arc::default(), "node-a-1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!state.leader.load(Ordering::Acquire));
    drop(tx);
    task.await.unwrap();
    let s = server.lock().await;
    assert!(
        s.writes.iter().all(|w| !w.contains("/leases/")),
        "{:?}",
        s.writes
    );
    assert_eq!(
        s.objects[LEASE_PATH]["spec"]["holderIdentity"],
        json!("node-z")
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_deletes_an_owned_service_no_row_calls_for_and_keeps_a_users() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::default()));
    let owned = plan_owned("old", "u1", "3");
    let mut user = plan_owned("mine", "u2", "4");
    user.metadata.labels = None;
    for s in [&owned, &user] {
        server.lock().await.objects.insert(
            format!(
                "/api/v1/namespaces/shop/services/{}",
                s.metadata.name.as_deref().unwrap()
            ),
            serde_json::to_value(s).unwrap(),
        );
    }
    let input = Arc::new(RegistrarInput {
        desired: Vec::new(),
        existing: vec![Arc::new(owned), Arc::new(user)],
        filters: Vec::new(),
    });
    let (tx, state, task) = start(&server, input);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = server.lock().await;
    assert!(
        s.objects
            .contains_key("/api/v1/namespaces/shop/services/mine")
    );
    assert!(
        !s.objects
            .contains_key("/api/v1/namespaces/shop/services/old")
    );
    let deletes: Vec<&String> = s
        .writes
        .iter()
        .filter(|w| w.starts_with("DELETE"))
        .collect();
    assert_eq!(deletes.len(), 1, "{:?}", s.writes);
    drop(s);
    // Done for this input: no write is repeated on the next ticks.
    let before = server
        .lock()
        .await
        .writes
        .iter()
        .filter(|w| !w.contains("/leases/"))
        .count();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = server
        .lock()
        .await
        .writes
        .iter()
        .filter(|w| !w.contains("/leases/"))
        .count();
    assert_eq!(before, after);
    assert!(!state.pending.load(Ordering::Acquire));
    drop(tx);
    task.await.unwrap();
}

/// The registrar task of `node-a-1` on `server`, working from `input`.
fn start(
    server: &Arc<tokio::sync::Mutex<Server>>,
    input: Arc<RegistrarInput>,
) -> (
    watch::Sender<Arc<RegistrarInput>>,
    Arc<RegistrarState>,
    tokio::task::JoinHandle<()>,
) {
    start_as(server, input, "node-a-1")
}

/// A registrar task claiming as `identity`.
fn start_as(
    server: &Arc<tokio::sync::Mutex<Server>>,
    input: Arc<RegistrarInput>,
    identity: &str,
) -> (
    watch::Sender<Arc<RegistrarInput>>,
    Arc<RegistrarState>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(input);
    let state = Arc::new(RegistrarState::default());
    let task = tokio::spawn(run(
        client(server),
        settings(identity),
        rx,
        state.clone(),
        Arc::new(RegistrarStats::default()),
    ));
    (tx, state, task)
}

fn plan_owned(name: &str, uid: &str, rv: &str) -> K8sService {
    let mut o = crate::registry::kube::generated::service_object(&desired(name, &[(8080, "http")]));
    o.metadata.uid = Some(uid.into());
    o.metadata.resource_version = Some(rv.into());
    o
}
