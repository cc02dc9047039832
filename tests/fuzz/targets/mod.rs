//! The targets, one module each; each exports its `TARGET`.

pub(crate) mod annotations;
pub(crate) mod authority;
pub(crate) mod client_hello;
pub(crate) mod cni;
pub(crate) mod dns;
pub(crate) mod http_head;
pub(crate) mod manifests;
pub(crate) mod route_match;
pub(crate) mod sniff;
