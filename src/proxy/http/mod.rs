//! HTTP on every entry path (addressing.md §2): the captured dial, the pod-IP dial, the
//! loopback proxy port and a captured dial to 18081. Every request is resolved on its own from
//! one model value (model.md §13), then answered, passed through or delivered over the hop.
//!
//! The parts, each importing only those below it (issue #7 §7: no circle between the
//! application side, the mesh-call side and the filters):
//!
//! | module | what | may import |
//! |---|---|---|
//! | [`serve`](mod@serve) | a connection (first-head check, hyper) and one request's resolution | `deliver`, `upstream` |
//! | [`deliver`] | the source side of a delivery: route filters, service header mutation, the hop | `mirror`, `upstream`, `filters`, `hop` |
//! | [`mirror`] | `RequestMirror` copies, fire-and-forget | [`super::mesh_call`] |
//! | [`upstream`] | a plain HTTP upstream: passthrough, and the application behind the hop | `app_pool`, `upgrade`, `socket` |
//! | [`limits`] | the head and idle deadlines of a served connection (also the inbound hop's) | nothing of `http` |
//!
//! A request the mesh makes itself (an `ext_authz` check, a mirror copy) is
//! [`super::mesh_call`], which imports neither this module nor the filters.

pub mod deliver;
pub mod limits;
pub mod mirror;
pub mod serve;
pub mod upstream;

pub use serve::{handle, serve};
pub use upstream::{connect_app, to_app};
