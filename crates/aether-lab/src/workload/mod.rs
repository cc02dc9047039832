//! The workloads of the demo and of every e2e suite (spec/legs.md §1.3, §1.4): the echo
//! servers that the acceptance workloads run, and the probe that the client pods run.
//!
//! Layer 2 (IO). It imports [`aether::netns`] and [`aether::time`] only: a workload is an
//! application, not part of the mesh, so nothing here reads the model, and no socket here
//! carries the daemon's mark (the probe's traffic must be captured like any client's).
//!
//! - [`echo`]: `aether echo`. Every listener identifies itself (`<workload>:<port>`), so that
//!   reaching the wrong port is a failure and never just a 200.
//! - [`probe`]: `aether probe`, and the library the local e2e suite calls in-process from
//!   inside a pod's network namespace. It writes HTTP/1.x by hand so that it can send what a
//!   well-behaved client never would (no `Host`, two `Host` fields, userinfo, absolute form).
//!   Its gRPC client (tonic over the probe's own connections) and its many-requests mode
//!   ([`probe::Probe::run_many`]) live there too.
//! - [`grpc`]: the wire schema the gRPC echo and the probe share (hand-written prost messages).

pub mod echo;
pub mod grpc;
pub mod probe;
