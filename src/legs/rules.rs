//! Legs for rules of the spec that spec/legs.md does not number (issue #7): consumer routes
//! without a ReferenceGrant (routes.md §2.3, §3) and authorization denials on every HTTP path
//! (routes.md §5.2, §5.5; addressing.md §11.1).
//!
//! Every denial leg fails when its filter is skipped: a skipped filter delivers, and the echo's
//! `200` is never a denial.

use super::{
    Check, Env, Leg, addr, answer, authz_count, echo, get, get_host, headers, http, loopback, name,
    with_headers,
};
use crate::workload::echo::{AUTHZ_DELAY_HEADER, AUTHZ_DENY_HEADER};
use crate::workload::probe::Outcome;

/// The legs, run after the extra legs.
pub static RULES: &[Leg] = &[
    leg!(
        "CONSUMER",
        "a consumer route (backend across namespaces, no grant) for its namespace only",
        Some("consumer"),
        consumer
    ),
    leg!(
        "DENY-RBAC",
        "service-level rbac denies by the hop's identity on every path",
        Some("deny-rbac"),
        deny_rbac
    ),
    leg!(
        "DENY-EXT",
        "an ext_authz denial: the server's status and body, 403 authz-denied's reason",
        None,
        deny_ext
    ),
    leg!(
        "AUTHZ-SLOW",
        "an ext_authz server slower than its timeout: 403 authz-unavailable",
        None,
        authz_slow
    ),
    leg!(
        "AUTHZ-DOWN",
        "an ext_authz server that does not answer: 403 authz-unavailable",
        Some("authz-down"),
        authz_down
    ),
    leg!(
        "DENY-LEVELS",
        "route-level and service-level authorization: a deny at either wins",
        Some("deny-levels"),
        deny_levels
    ),
];

const CLIENT: &str = "mp-client";
const NOCAP: &str = "mp-client-nocapture";
const OTHER: &str = "mp-client-other";

/// The three HTTP paths to port 8080 of a workload: a captured dial by mesh name (from
/// mp-client), the loopback proxy port (from mp-client-nocapture), and a pod-IP dial to its
/// first pod (from mp-client). Each with its client, dial and `Host`.
fn three_paths(env: &Env, wl: &str) -> Result<Vec<(&'static str, super::Dial, String)>, String> {
    let host = format!("{}:8080", env.mesh(wl));
    let pod = env.pod_ip("mp", &format!("{wl}-0"))?;
    Ok(vec![
        (CLIENT, name(&env.mesh(wl), 8080), host.clone()),
        (NOCAP, loopback(), host),
        (CLIENT, addr(pod, 8080), format!("{pod}:8080")),
    ])
}

/// A denial the authorization server wrote: its status, its body, the mesh's reason.
fn server_denied(o: &Outcome, status: u16) -> Check {
    if o.status != Some(status)
        || o.reason() != Some("authz-denied")
        || o.first_line() != "denied by mp-authz"
    {
        return Err(format!(
            "want {status} authz-denied with the server's body, got {}",
            o.summary()
        ));
    }
    Ok(format!("{status} authz-denied"))
}

async fn consumer(env: &Env) -> Check {
    env.overlay(Some("consumer")).await?;
    let mesh = env.mesh("mp-multi");
    let consumer = |o: &Outcome| {
        echo(o, "mp-multi", 9090)?;
        headers(o, &[("x-consumer", Some("mp-other"))])
    };
    for p in [8080, 9090] {
        for n in [mesh.clone(), "mp-multi.mp.svc.cluster.local".to_owned()] {
            http(env, OTHER, name(&n, p), get("/"), consumer).await?;
        }
        let host = format!("{mesh}:{p}");
        http(env, OTHER, loopback(), get_host("/", &host), consumer).await?;
        // Callers of the parent's namespace get the producer routes: none, so port p.
        http(env, CLIENT, name(&mesh, p), get("/"), |o| {
            echo(o, "mp-multi", p)?;
            headers(o, &[("x-consumer", None)])
        })
        .await?;
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            echo(o, "mp-multi", p)?;
            headers(o, &[("x-consumer", None)])
        })
        .await?;
    }
    Ok(
        "mp-other: mp-multi:9090 + x-consumer on 8080 and 9090; mp: each port, no x-consumer"
            .into(),
    )
}

async fn deny_rbac(env: &Env) -> Check {
    env.overlay(Some("deny-rbac")).await?;
    for (client, dial, host) in three_paths(env, "mp-httponly")? {
        http(env, client, dial, get_host("/", &host), |o| {
            answer(o, 403, "authz-denied", Some(""))
        })
        .await?;
    }
    // The one identity the rule allows is delivered: the rule reads the caller, it does not
    // refuse everything.
    let host = format!("{}:8080", env.mesh("mp-httponly"));
    http(
        env,
        OTHER,
        name(&env.mesh("mp-httponly"), 8080),
        get("/"),
        |o| echo(o, "mp-httponly", 8080),
    )
    .await?;
    http(env, OTHER, loopback(), get_host("/", &host), |o| {
        echo(o, "mp-httponly", 8080)
    })
    .await?;
    Ok("403 authz-denied on 3 paths; mp-client-other delivered".into())
}

async fn deny_ext(env: &Env) -> Check {
    let before = authz_count(env).await?;
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        let send = with_headers("/", Some(&host), &[(AUTHZ_DENY_HEADER, "401")]);
        http(env, client, dial, send, |o| server_denied(o, 401)).await?;
    }
    let after = authz_count(env).await?;
    if after != before + 3 {
        return Err(format!(
            "3 denied requests made {} authorization checks, want 3",
            after - before
        ));
    }
    Ok("401 authz-denied with the server's body on 3 paths, one check each".into())
}

async fn authz_slow(env: &Env) -> Check {
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        // The base filter's timeout is 200 ms; the server waits 1 s.
        let send = with_headers("/", Some(&host), &[(AUTHZ_DELAY_HEADER, "1000")]);
        http(env, client, dial, send, |o| {
            answer(o, 403, "authz-unavailable", Some(""))
        })
        .await?;
    }
    Ok("403 authz-unavailable on 3 paths".into())
}

async fn authz_down(env: &Env) -> Check {
    env.overlay(Some("authz-down")).await?;
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        http(env, client, dial, get_host("/", &host), |o| {
            answer(o, 403, "authz-unavailable", Some(""))
        })
        .await?;
    }
    Ok("403 authz-unavailable on 3 paths".into())
}

async fn deny_levels(env: &Env) -> Check {
    env.overlay(Some("deny-levels")).await?;
    let mesh = env.mesh("mp-multi");
    let host = format!("{mesh}:9090");
    // Both levels allow.
    http(env, CLIENT, name(&mesh, 9090), get("/"), |o| {
        echo(o, "mp-multi", 8080)?;
        headers(o, &[("x-svc", Some("1"))])
    })
    .await?;
    // The service level (destination) denies; the route level allowed.
    let deny = [(AUTHZ_DENY_HEADER, "1")];
    http(
        env,
        CLIENT,
        name(&mesh, 9090),
        with_headers("/", None, &deny),
        |o| server_denied(o, 403),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        with_headers("/", Some(&host), &deny),
        |o| server_denied(o, 403),
    )
    .await?;
    // The route level (source) denies mp-other's caller: the request ends at the source, so
    // the service level's server is never asked.
    let before = authz_count(env).await?;
    http(env, OTHER, name(&mesh, 9090), get("/"), |o| {
        answer(o, 403, "authz-denied", Some(""))
    })
    .await?;
    http(env, OTHER, loopback(), get_host("/", &host), |o| {
        answer(o, 403, "authz-denied", Some(""))
    })
    .await?;
    let after = authz_count(env).await?;
    if after != before {
        return Err(format!(
            "a route-level denial made {} service-level checks, want 0",
            after - before
        ));
    }
    Ok(
        "both allow: delivered; service level denies: 403; route level denies: 403, no check"
            .into(),
    )
}
