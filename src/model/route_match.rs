//! Placeholder until the route matching work lands (replaced at merge).
#![allow(missing_docs, unreachable_pub)]
use crate::model::snapshot::{HttpRouteKind, HttpRule};
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTable {
    n: Vec<usize>,
}
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a [(String, String)],
}
#[derive(Clone, Debug)]
pub struct RouteInput<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub created: Option<&'a str>,
    pub kind: HttpRouteKind,
    pub rules: &'a [HttpRule],
}
#[derive(Clone, Debug)]
pub struct Selected {
    pub route: usize,
    pub rule: usize,
    pub matched_prefix: Option<String>,
}
#[derive(Clone, Debug)]
pub struct RouteProblem {
    pub detail: String,
}
impl RouteTable {
    pub fn build(routes: &[RouteInput<'_>]) -> (Self, Vec<RouteProblem>) {
        (
            Self {
                n: routes.iter().map(|r| r.rules.len()).collect(),
            },
            vec![],
        )
    }
    pub fn select(&self, _req: &RequestView<'_>) -> Option<Selected> {
        self.n
            .iter()
            .enumerate()
            .find(|(_, n)| **n > 0)
            .map(|(i, _)| Selected {
                route: i,
                rule: 0,
                matched_prefix: None,
            })
    }
}
