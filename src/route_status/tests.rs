//! The writer against a scripted API server (`tower-test`) holding one HTTPRoute: what it
//! writes, what it keeps of other controllers, and what it does on a `409`.

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::json;

use super::*;
use crate::model::attach::Condition;
use crate::proxy::Counter;

const ROUTE: &str = "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes/web";

struct Server {
    route: Value,
    version: u64,
    /// PUT bodies received.
    puts: Vec<Value>,
    /// Before answering the next PUT: another controller writes its own entry (a `409` for
    /// the PUT that read the older version).
    interleave: Option<Value>,
}

fn respond(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(v.to_string().into_bytes()))
        .unwrap()
}

fn conflict() -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict",
        "message": "the object has been modified", "code": 409})
}

impl Server {
    fn new(parents: &[Value]) -> Self {
        Self {
            route: json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "10", "generation": 2},
                "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "shop", "port": 8080}]},
                "status": {"parents": parents.to_vec()},
            }),
            version: 10,
            puts: Vec::new(),
            interleave: None,
        }
    }

    async fn answer(&mut self, req: Request<Body>) -> Response<Body> {
        use http_body_util::BodyExt;
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        match (method, path.as_str()) {
            (Method::GET, ROUTE) => respond(200, &self.route),
            (Method::PUT, p) if p == format!("{ROUTE}/status") => {
                if let Some(foreign) = self.interleave.take() {
                    self.version += 1;
                    self.route["metadata"]["resourceVersion"] = json!(self.version.to_string());
                    self.route["status"]["parents"]
                        .as_array_mut()
                        .unwrap()
                        .push(foreign);
                }
                let v: Value = serde_json::from_slice(&body).unwrap();
                self.puts.push(v.clone());
                if v["metadata"]["resourceVersion"] != self.route["metadata"]["resourceVersion"] {
                    return respond(409, &conflict());
                }
                self.version += 1;
                self.route["status"] = v["status"].clone();
                self.route["metadata"]["resourceVersion"] = json!(self.version.to_string());
                respond(200, &self.route)
            }
            _ => respond(
                404,
                &json!({"kind": "Status", "code": 404, "reason": "NotFound"}),
            ),
        }
    }
}

fn client(server: &Arc<tokio::sync::Mutex<Server>>) -> Client {
    let server = server.clone();
    crate::test_util::kube_mock::client(move |req| {
        let server = server.clone();
        async move { server.lock().await.answer(req).await }
    })
}

fn foreign(name: &str) -> Value {
    json!({"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name},
        "controllerName": "example.com/other",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2, "x-extra": "kept"}]})
}

fn model_status(accepted: &str) -> RouteStatus {
    let parent = ParentRef {
        target: ObjectRef {
            group: String::new(),
            kind: "Service".into(),
            namespace: None,
            name: "shop".into(),
        },
        port: Some(8080),
        section_name: None,
    };
    let cond = |t: &str, s: &str, r: &str| Condition {
        type_: t.into(),
        status: s.into(),
        reason: r.into(),
        message: String::new(),
    };
    RouteStatus::of(
        "HTTPRoute",
        "shop",
        "web",
        2,
        &parent,
        vec![
            cond(
                "Accepted",
                accepted,
                if accepted == "True" {
                    "Accepted"
                } else {
                    "NoMatchingParent"
                },
            ),
            cond("ResolvedRefs", "True", "ResolvedRefs"),
        ],
    )
}

fn key() -> RouteKey {
    ("HTTPRoute".into(), "shop".into(), "web".into())
}

/// [`write`] of `statuses` to the route stamped `stamp`, its conflicts counted nowhere.
async fn put(
    c: &Client,
    statuses: &[&RouteStatus],
    stamp: &str,
) -> Result<Option<Vec<Entry>>, StatusError> {
    write(c, &key(), statuses, stamp, &Counter::default()).await
}

#[tokio::test]
async fn aethers_entry_is_added_beside_another_controllers_which_is_kept_byte_for_byte() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[foreign("gw")])));
    let c = client(&server);
    let status = model_status("True");
    let written = put(&c, &[&status], "2026-12-02T00:00:00Z")
        .await
        .unwrap()
        .expect("a write");
    assert_eq!(written.len(), 1);
    let s = server.lock().await;
    let parents = s.route["status"]["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 2);
    assert_eq!(
        parents[0],
        foreign("gw"),
        "the other controller's entry, untouched"
    );
    assert_eq!(parents[1]["controllerName"], json!(CONTROLLER_NAME));
    assert_eq!(parents[1]["parentRef"]["port"], json!(8080));
    let conds = parents[1]["conditions"].as_array().unwrap();
    assert_eq!(conds[0]["type"], json!("Accepted"));
    assert_eq!(conds[0]["observedGeneration"], json!(2));
    assert_eq!(
        conds[0]["lastTransitionTime"],
        json!("2026-12-02T00:00:00Z")
    );
    // The write carried the resourceVersion read as its precondition.
    assert_eq!(s.puts[0]["metadata"]["resourceVersion"], json!("10"));
}

#[tokio::test]
async fn nothing_is_written_when_only_the_time_would_change() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[foreign("gw")])));
    let c = client(&server);
    let status = model_status("True");
    put(&c, &[&status], "2026-12-02T00:00:00Z").await.unwrap();
    let again = put(&c, &[&status], "2026-12-02T09:00:00Z").await.unwrap();
    assert_eq!(again, None);
    assert_eq!(server.lock().await.puts.len(), 1);
}

#[tokio::test]
async fn a_conflict_is_read_again_and_retried_keeping_the_entry_written_in_between() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[foreign("gw")])));
    server.lock().await.interleave = Some(foreign("gw2"));
    let c = client(&server);
    let status = model_status("True");
    put(&c, &[&status], "2026-12-02T00:00:00Z")
        .await
        .unwrap()
        .expect("a write after the retry");
    let s = server.lock().await;
    assert_eq!(s.puts.len(), 2, "one 409, then one write");
    let parents = s.route["status"]["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 3);
    assert_eq!(parents[0], foreign("gw"));
    assert_eq!(
        parents[1],
        foreign("gw2"),
        "written between our read and our write: kept"
    );
    assert_eq!(parents[2]["controllerName"], json!(CONTROLLER_NAME));
}

#[tokio::test]
async fn a_changed_condition_replaces_aethers_entry_in_place_and_stamps_only_it() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[foreign("gw")])));
    let c = client(&server);
    put(&c, &[&model_status("True")], "T0").await.unwrap();
    server.lock().await.route["status"]["parents"]
        .as_array_mut()
        .unwrap()
        .push(foreign("gw3"));
    put(&c, &[&model_status("False")], "T1")
        .await
        .unwrap()
        .expect("a write");
    let s = server.lock().await;
    let parents = s.route["status"]["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 3);
    assert_eq!(parents[0], foreign("gw"));
    let ours = &parents[1];
    assert_eq!(
        ours["controllerName"],
        json!(CONTROLLER_NAME),
        "in its place"
    );
    assert_eq!(ours["conditions"][0]["status"], json!("False"));
    assert_eq!(ours["conditions"][0]["lastTransitionTime"], json!("T1"));
    assert_eq!(ours["conditions"][1]["lastTransitionTime"], json!("T0"));
    assert_eq!(parents[2], foreign("gw3"));
}

#[tokio::test(start_paused = true)]
async fn the_task_writes_each_route_once_per_input_and_says_when_it_is_done() {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[])));
    let status = model_status("True");
    let held = BTreeMap::from([(key(), HeldRoute { ours: Vec::new() })]);
    let (tx, rx) = watch::channel(Arc::new(StatusInput {
        statuses: vec![status.clone()],
        held,
    }));
    let pending = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(RouteStatusStats::default());
    let task = tokio::spawn(run(
        client(&server),
        rx,
        pending.clone(),
        || false,
        stats.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        server.lock().await.puts.len(),
        1,
        "ticks do not repeat the write"
    );
    assert!(
        pending.load(Ordering::Acquire),
        "written, not yet seen back"
    );
    // The watch brings the write back: settled.
    let ours = ours_of(server.lock().await.route.get("status"));
    tx.send(Arc::new(StatusInput {
        statuses: vec![status],
        held: BTreeMap::from([(key(), HeldRoute { ours })]),
    }))
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!pending.load(Ordering::Acquire));
    assert_eq!(server.lock().await.puts.len(), 1);
    drop(tx);
    task.await.unwrap();
}

/// Two nodes' writers over one route, each fed what a watch of the route holds after every
/// write: the first follows the registrar's Lease or not (`follows`), the second follows it.
/// The puts the server received, and each writer's stats, once `settle` has passed.
async fn two_writers(
    holder_writes: bool,
    settle: Duration,
) -> (usize, Arc<RouteStatusStats>, Arc<RouteStatusStats>) {
    let server = Arc::new(tokio::sync::Mutex::new(Server::new(&[])));
    let status = model_status("True");
    let input = |ours: Vec<Entry>| {
        Arc::new(StatusInput {
            statuses: vec![status.clone()],
            held: BTreeMap::from([(key(), HeldRoute { ours })]),
        })
    };
    let (holder_tx, holder_rx) = watch::channel(input(Vec::new()));
    let (follower_tx, follower_rx) = watch::channel(input(Vec::new()));
    let holder_stats = Arc::new(RouteStatusStats::default());
    let follower_stats = Arc::new(RouteStatusStats::default());
    let holder = holder_writes.then(|| {
        tokio::spawn(run(
            client(&server),
            holder_rx,
            Arc::default(),
            || false,
            holder_stats.clone(),
        ))
    });
    let follower = tokio::spawn(run(
        client(&server),
        follower_rx,
        Arc::default(),
        || true,
        follower_stats.clone(),
    ));
    // The watch: each new version of the route reaches both writers.
    let mut seen = server.lock().await.version;
    let until = tokio::time::Instant::now() + settle;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let s = server.lock().await;
        if s.version != seen {
            seen = s.version;
            let ours = ours_of(s.route.get("status"));
            holder_tx.send_replace(input(ours.clone()));
            follower_tx.send_replace(input(ours));
        }
    }
    let puts = server.lock().await.puts.len();
    drop((holder_tx, follower_tx));
    if let Some(h) = holder {
        h.await.unwrap();
    }
    follower.await.unwrap();
    (puts, holder_stats, follower_stats)
}

/// issue #36 item 3: a route change that two nodes see alike costs one PUT (the holder's), not
/// one per node with all but one answered `409`.
#[tokio::test(start_paused = true)]
async fn a_change_both_nodes_agree_on_is_written_once_by_the_lease_holder() {
    let (puts, holder, follower) = two_writers(true, Duration::from_secs(20)).await;
    assert_eq!(puts, 1, "one PUT for the change");
    assert_eq!(holder.writes.get(), 1);
    assert_eq!(follower.writes.get(), 0);
    assert_eq!(follower.deferred.get(), 1);
    assert_eq!(holder.conflicts.get() + follower.conflicts.get(), 0);
}

/// issue #36 item 3: a follower whose change the holder does not write (it is down, or sees
/// other facts) writes it itself once the grace is over.
#[tokio::test(start_paused = true)]
async fn a_follower_writes_a_change_the_holder_did_not_after_the_grace() {
    let (puts, _, follower) = two_writers(false, merge::FOLLOWER_GRACE / 2).await;
    assert_eq!(puts, 0, "left to the holder during the grace");
    let (puts, _, follower_later) =
        two_writers(false, merge::FOLLOWER_GRACE + Duration::from_secs(2)).await;
    assert_eq!(puts, 1, "written after the grace");
    assert_eq!(follower.deferred.get(), 1);
    assert_eq!(follower_later.writes.get(), 1);
}
