//! The manifest directory as the objects the fake API server should hold.
//!
//! Every `.yaml`/`.yml` file under the directory (recursively, in path order), every document in
//! it; an empty document is skipped, and any other document the server cannot place (not YAML,
//! no `kind`, a kind it does not serve, no name, twice the same object) is an error naming the
//! file and the 1-based document: the reload is refused whole and the objects stay as they were.
//! A namespaced object without a namespace is in `default`, as with `kubectl`.
//!
//! The directory has no controller manager, so the EndpointSlices of its Services with a
//! selector are computed here as the EndpointSlice controller would
//! ([`aether::registry::file::endpoint_slices_for`], the file registry's own rules), and held as
//! objects of the directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod as K8sPod, Service as K8sService};
use serde_json::Value;

use super::resources::{ResourceType, by_kind, by_plural};
use super::store::Key;
use aether::registry::file::{FileError, endpoint_slices_for, read_manifests, split_documents};

/// Why the directory gives no set of objects.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A file or directory cannot be read.
    #[error(transparent)]
    Read(#[from] FileError),
    /// A document cannot be placed.
    #[error("{}, document {document}: {why}", file.display())]
    Document {
        /// The file.
        file: PathBuf,
        /// The document's 1-based index in it.
        document: usize,
        /// What is wrong.
        why: String,
    },
}

/// The objects `dir` describes, by key (see the module doc).
pub fn load(dir: &Path) -> Result<Vec<(Key, Value)>, DirError> {
    let mut out: BTreeMap<Key, Value> = BTreeMap::new();
    for (file, text) in read_manifests(dir)? {
        let (documents, broken) = split_documents(&text);
        if let Some((document, message)) = broken {
            return Err(DirError::Document {
                file,
                document,
                why: format!("not YAML: {message}"),
            });
        }
        for (i, doc) in documents.into_iter().enumerate() {
            let at = |why: String| DirError::Document {
                file: file.clone(),
                document: i + 1,
                why,
            };
            if doc.is_null() {
                continue;
            }
            let (key, doc) = place(doc).map_err(at)?;
            if out.contains_key(&key) {
                return Err(at(format!(
                    "{} {}/{} is given twice",
                    key.resource.kind, key.namespace, key.name
                )));
            }
            out.insert(key, doc);
        }
    }
    let slices = derived_slices(&out);
    for (key, slice) in slices {
        out.entry(key).or_insert(slice);
    }
    Ok(out.into_iter().collect())
}

/// The key of a document, and the document with its namespace filled in.
fn place(mut doc: Value) -> Result<(Key, Value), String> {
    if !doc.is_object() {
        return Err("not an object".into());
    }
    let api_version = doc["apiVersion"].as_str().unwrap_or("");
    let kind = doc["kind"].as_str().ok_or("no kind")?;
    let resource = by_kind(api_version, kind)
        .ok_or_else(|| format!("the lab's API server does not serve {api_version:?} {kind:?}"))?;
    let name = doc["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or("no metadata.name")?
        .to_owned();
    let namespace = if resource.namespaced {
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_owned();
        doc["metadata"]["namespace"] = ns.clone().into();
        ns
    } else {
        String::new()
    };
    Ok((
        Key {
            resource,
            namespace,
            name,
        },
        doc,
    ))
}

/// The EndpointSlices of the directory's Services with a selector.
fn derived_slices(objects: &BTreeMap<Key, Value>) -> Vec<(Key, Value)> {
    let typed = |kind: &'static str| {
        objects
            .iter()
            .filter(move |(k, _)| k.resource.kind == kind && k.resource.group.is_empty())
            .map(|(_, v)| v)
    };
    // A document that does not read as its type feeds no slice; the daemon reports it itself.
    let services: Vec<K8sService> = typed("Service")
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect();
    let pods: Vec<K8sPod> = typed("Pod")
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect();
    let Some(resource) = by_plural("discovery.k8s.io", "endpointslices") else {
        return Vec::new();
    };
    let services: Vec<&K8sService> = services.iter().collect();
    let pods: Vec<&K8sPod> = pods.iter().collect();
    endpoint_slices_for(&services, &pods)
        .into_iter()
        .filter_map(|slice| {
            let mut v = serde_json::to_value(&slice).ok()?;
            v["apiVersion"] = "discovery.k8s.io/v1".into();
            v["kind"] = "EndpointSlice".into();
            Some((slice_key(resource, &slice)?, v))
        })
        .collect()
}

fn slice_key(
    resource: ResourceType,
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> Option<Key> {
    Some(Key {
        resource,
        namespace: slice.metadata.namespace.clone()?,
        name: slice.metadata.name.clone()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn every_document_is_placed_with_its_namespace_and_selector_services_get_slices() {
        let dir = tempdir("placed");
        write(
            &dir,
            "a.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, labels: {app: web}}\n\
             spec: {containers: [{name: c, image: i}]}\nstatus: {podIP: 10.244.1.5}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
             spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}\n---\n",
        );
        let objects = load(&dir).unwrap();
        let names: Vec<String> = objects
            .iter()
            .map(|(k, _)| format!("{} {}/{}", k.resource.kind, k.namespace, k.name))
            .collect();
        assert!(names.contains(&"Namespace /shop".to_owned()), "{names:?}");
        assert!(names.contains(&"Pod default/web-0".to_owned()), "{names:?}");
        let slice = objects
            .iter()
            .find(|(k, _)| k.resource.kind == "EndpointSlice")
            .expect("a slice for the selector Service");
        assert_eq!(
            slice.1["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        assert_eq!(slice.1["endpoints"][0]["addresses"][0], "10.244.1.5");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_document_the_server_cannot_place_is_an_error_naming_file_and_document() {
        let dir = tempdir("unplaced");
        write(
            &dir,
            "b.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
        );
        let e = load(&dir).unwrap_err().to_string();
        assert!(e.contains("b.yaml, document 2"), "{e}");
        assert!(e.contains("Deployment"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "aether-apiserver-dir-{what}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
