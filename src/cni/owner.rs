//! Whether the CNI installer, stopping, takes aether's entry out of the node's conflist
//! (docs/cni.md, "Install", step 6; issue #35 item 4).
//!
//! The entry goes only when the installer is sure that aether is being uninstalled: its own
//! DaemonSet is gone (`404`) or being deleted (`deletionTimestamp` set). Every other stop keeps
//! it, because every other stop is followed by a daemon again: a rollout (the DaemonSet is still
//! there and a new pod comes), a pod deleted by hand, a node shutting down. A pod created on the
//! node meanwhile then waits (its ADD answered CNI error 11, kubelet retrying the sandbox)
//! instead of starting without capture. An answer that cannot be had (no API server, no RBAC,
//! no answer within [`ASK_TIMEOUT`], no DaemonSet named) keeps the entry too, with the reason
//! logged: fail closed. An operator who uninstalled and finds the entry left removes it with
//! `aether cni uninstall` (docs/kubernetes.md, "Uninstall").
//!
//! [`decide`] is the rule, pure; [`ask`] reads the DaemonSet through kube (IO, Layer 2).

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet as K8sDaemonSet;

/// How long the stopping installer waits for the API server's answer. Well inside the pod's
/// `terminationGracePeriodSeconds` (30 s in the chart).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The DaemonSet whose pods run this installer (`--daemonset`, with the release namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for DaemonSetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the API server said about the DaemonSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// It is there, not being deleted.
    Present,
    /// It is there with a `deletionTimestamp`: being deleted.
    Deleting,
    /// It is not there (`404`).
    Gone,
    /// No answer could be had, and why.
    Unknown(String),
}

/// What the stopping installer does with the entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtStop {
    /// Take the entry out: aether is being uninstalled.
    Remove(String),
    /// Leave it: a daemon comes again, or it cannot be told (fail closed).
    Keep(String),
}

/// The rule (see the module doc): `owner` is `None` when no DaemonSet was named.
pub fn decide(daemonset: Option<&DaemonSetRef>, owner: Option<&Owner>) -> AtStop {
    let Some(ds) = daemonset else {
        return AtStop::Keep(
            "no DaemonSet named (--daemonset): the installer cannot tell an uninstall from a restart"
                .into(),
        );
    };
    match owner {
        Some(Owner::Gone) => AtStop::Remove(format!("the DaemonSet {ds} is gone: uninstalled")),
        Some(Owner::Deleting) => {
            AtStop::Remove(format!("the DaemonSet {ds} is being deleted: uninstalled"))
        }
        Some(Owner::Present) => AtStop::Keep(format!(
            "the DaemonSet {ds} is still there (a rollout, or this pod deleted or its node stopping): a daemon comes again"
        )),
        Some(Owner::Unknown(why)) => AtStop::Keep(format!(
            "cannot tell whether the DaemonSet {ds} is being removed ({why})"
        )),
        None => AtStop::Keep(format!("the DaemonSet {ds} was not asked for")),
    }
}

/// Ask the API server for `ds`, within [`ASK_TIMEOUT`].
pub async fn ask(client: kube::Client, ds: &DaemonSetRef) -> Owner {
    let api: kube::Api<K8sDaemonSet> = kube::Api::namespaced(client, &ds.namespace);
    match tokio::time::timeout(ASK_TIMEOUT, api.get_opt(&ds.name)).await {
        Err(_) => Owner::Unknown(format!("no answer within {ASK_TIMEOUT:?}")),
        Ok(Err(e)) => Owner::Unknown(crate::DisplayChain(&e).to_string()),
        Ok(Ok(None)) => Owner::Gone,
        Ok(Ok(Some(d))) if d.metadata.deletion_timestamp.is_some() => Owner::Deleting,
        Ok(Ok(Some(_))) => Owner::Present,
    }
}

/// [`decide`] on the answer [`ask`] gets (asking only when a DaemonSet is named and a client
/// could be made).
pub async fn at_stop(
    client: Result<kube::Client, String>,
    daemonset: Option<&DaemonSetRef>,
) -> AtStop {
    let Some(ds) = daemonset else {
        return decide(None, None);
    };
    let owner = match client {
        Ok(client) => ask(client, ds).await,
        Err(why) => Owner::Unknown(format!("no client of the API server: {why}")),
    };
    decide(Some(ds), Some(&owner))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aether_lab::lab::apiserver::{Settings, serve_on_loopback};
    use kube::api::{DeleteParams, PostParams};

    fn ds() -> DaemonSetRef {
        DaemonSetRef {
            namespace: "aether-system".into(),
            name: "aether".into(),
        }
    }

    fn daemonset(finalizers: &[&str]) -> K8sDaemonSet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "aether", "namespace": "aether-system", "finalizers": finalizers},
            "spec": {
                "selector": {"matchLabels": {"app": "aether"}},
                "template": {
                    "metadata": {"labels": {"app": "aether"}},
                    "spec": {"containers": [{"name": "aether", "image": "aether:1"}]}
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_a_daemonset_gone_or_being_deleted_removes_the_entry() {
        let d = ds();
        assert!(matches!(
            decide(Some(&d), Some(&Owner::Gone)),
            AtStop::Remove(_)
        ));
        assert!(matches!(
            decide(Some(&d), Some(&Owner::Deleting)),
            AtStop::Remove(_)
        ));
        for kept in [
            decide(Some(&d), Some(&Owner::Present)),
            decide(Some(&d), Some(&Owner::Unknown("403 Forbidden".into()))),
            decide(Some(&d), None),
            decide(None, None),
            decide(None, Some(&Owner::Gone)),
        ] {
            assert!(matches!(kept, AtStop::Keep(_)), "{kept:?}");
        }
        let AtStop::Keep(why) = decide(Some(&d), Some(&Owner::Unknown("403 Forbidden".into())))
        else {
            unreachable!()
        };
        assert!(
            why.contains("403 Forbidden") && why.contains("aether-system/aether"),
            "{why}"
        );
    }

    /// Through a real `kube::Client` and the lab's API server: the DaemonSet there, being
    /// deleted (foreground, so a finalizer holds it), gone, and the server refusing connections.
    #[tokio::test]
    async fn the_stopping_installer_asks_for_its_daemonset() {
        let (server, _, client) = serve_on_loopback(Settings::default(), None).await;
        let api: kube::Api<K8sDaemonSet> = kube::Api::namespaced(client.clone(), "aether-system");
        assert_eq!(ask(client.clone(), &ds()).await, Owner::Gone);
        api.create(&PostParams::default(), &daemonset(&[]))
            .await
            .unwrap();
        assert_eq!(ask(client.clone(), &ds()).await, Owner::Present);
        api.delete("aether", &DeleteParams::foreground())
            .await
            .unwrap();
        assert_eq!(ask(client.clone(), &ds()).await, Owner::Deleting);
        // The finalizer taken off (the garbage collector's part), the object goes.
        api.patch(
            "aether",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        assert_eq!(ask(client.clone(), &ds()).await, Owner::Gone);
        api.create(&PostParams::default(), &daemonset(&[]))
            .await
            .unwrap();
        server.stop();
        let owner = ask(client.clone(), &ds()).await;
        assert!(matches!(owner, Owner::Unknown(_)), "{owner:?}");
        assert!(matches!(
            at_stop(Ok(client), Some(&ds())).await,
            AtStop::Keep(_)
        ));
        assert!(matches!(
            at_stop(Err("no kubeconfig".into()), Some(&ds())).await,
            AtStop::Keep(_)
        ));
    }
}
