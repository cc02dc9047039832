//! A `kube::Client` whose requests a test's function answers (`tower-test`): the scripted API
//! servers of the Kubernetes writers' wire tests.

use std::future::Future;

use http::{Request, Response};
use kube::client::Body;

/// A client that hands each request to `answer` and sends back what it returns.
pub fn client<F, Fut>(answer: F) -> kube::Client
where
    F: Fn(Request<Body>) -> Fut + Send + 'static,
    Fut: Future<Output = Response<Body>> + Send,
{
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            send.send_response(answer(req).await);
        }
    });
    kube::Client::new(service, "default")
}
