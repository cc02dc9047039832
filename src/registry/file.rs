//! The file registry: a directory of Kubernetes manifests read as one [`Snapshot`].
//!
//! Layer 2 (IO): [`load_dir`] reads files; everything after the read is pure and goes through
//! the same conversions as the Kubernetes backend ([`crate::registry::kube::convert`]).
//!
//! Invariants:
//! - Every `*.yaml`/`*.yml` file under the directory is read, recursively, in sorted path order,
//!   and the documents of a file in order, so one directory always gives one snapshot.
//! - A file is used whole or not at all (issue #8, finding 8). It is *whole* when it is UTF-8,
//!   every YAML document in it parses, and it is not empty where it had content (a file
//!   truncated to be rewritten in place). A file that is not whole is replaced by its last
//!   content that was ([`LastGood`], kept by the caller across loads, see
//!   [`load_dir_keeping`]), or skipped when it never was, and reported as a [`FileFault`]: a
//!   file read while it is being written never takes its objects out of the registry. Writers
//!   should still replace files atomically (write elsewhere, then rename; docs/node.md).
//! - A bad document of a whole file is reported as a [`ManifestProblem`] (file, 1-based
//!   document index, kind and name when known, what was wrong) and skipped; it never stops the
//!   load. Only a directory that cannot be listed is a [`FileError`].
//! - The later of two objects with the same (kind, namespace, name) is a problem and skipped.
//! - Pods carry `status.podIP`; readiness is the `Ready` condition when given, otherwise Ready
//!   (spec/model.md §3.5). A missing `metadata.namespace` means `default`, as with `kubectl`.
//! - EndpointSlices of Services with a selector are computed as Kubernetes would
//!   ([`endpoint_slices_for`]); explicit EndpointSlice documents are kept as well.
//! - ClusterIPs are kept as written; a Service without one is left without one.

mod slices;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gateway_api::experimental::grpcroutes::GrpcRoute as GatewayGrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute as GatewayHttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant as GatewayReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute as GatewayTcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute as GatewayTlsRoute;
use gateway_api::experimental::udproutes::UdpRoute as GatewayUdpRoute;
use k8s_openapi::api::core::v1::Namespace as K8sNamespace;
use k8s_openapi::api::core::v1::Pod as K8sPod;
use k8s_openapi::api::core::v1::Service as K8sService;
use k8s_openapi::api::discovery::v1::EndpointSlice as K8sEndpointSlice;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use slices::{MANAGED_BY, endpoint_slices_for};

use crate::model::Snapshot;
use crate::registry::kube::convert::{
    self, ConvertError, MissingReadyCondition, Registration, convert_endpoint_slice,
    convert_grpc_route, convert_http_route, convert_mesh_filter, convert_namespace, convert_pod,
    convert_reference_grant, convert_service, convert_tcp_route, convert_tls_route,
    convert_udp_route,
};
use crate::registry::kube::mesh_filter::MeshFilterResource;
use crate::registry::kube::pod::MeshPod;
use crate::yaml::YamlError;

/// What [`load_dir`] read: the snapshot of every good document, and every bad one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileLoad {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Documents that were reported and skipped, in file and document order.
    pub problems: Vec<ManifestProblem>,
    /// Files that did not read whole, in path order: each was replaced by its last good
    /// content, or skipped when it never read whole.
    pub faults: Vec<FileFault>,
}

/// The last content of each manifest file that read whole, by path: what a file that does not
/// read whole is replaced by ([`load_dir_keeping`]). The daemon keeps one across reloads; it
/// holds no more than the directory's text.
#[derive(Clone, Debug, Default)]
pub struct LastGood {
    files: BTreeMap<PathBuf, String>,
    /// The problems and faults the last load reported, as logged: the daemon logs each once
    /// per change, not at every reload (issue #36 item 6).
    pub reported: std::collections::BTreeSet<String>,
}

impl LastGood {
    /// How many files it holds.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// One manifest file that did not read whole this time, and what was used instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileFault {
    /// The file.
    pub file: PathBuf,
    /// Why it is not whole.
    pub issue: FileIssue,
    /// Whether its last good content was used (`false`: it never read whole, and is skipped).
    pub kept_last_good: bool,
}

impl fmt::Display for FileFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; ", self.file.display(), self.issue)?;
        if self.kept_last_good {
            write!(
                f,
                "its last content that read whole is used until it reads whole again"
            )
        } else {
            write!(f, "skipped: it never read whole")
        }
    }
}

/// Why a manifest file is not whole (it is being written, or it is damaged).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FileIssue {
    /// It could not be read.
    #[error("cannot be read ({message})")]
    Unreadable {
        /// The IO error.
        message: String,
    },
    /// It is not UTF-8 text.
    #[error("not UTF-8 (the first bad byte is at offset {offset})")]
    NotUtf8 {
        /// Bytes before the first that is not UTF-8.
        offset: usize,
    },
    /// A YAML document of it does not parse.
    #[error("document {document} is not valid YAML ({message})")]
    Syntax {
        /// The 1-based index of the first document that does not parse.
        document: usize,
        /// The parser's message.
        message: String,
    },
    /// It is larger than [`crate::yaml::MAX_BYTES`]: refused unparsed.
    #[error("{bytes} bytes, over the limit of {limit}; not parsed")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A document of it nests deeper than [`crate::yaml::MAX_DEPTH`]: refused at the first
    /// level past the bound.
    #[error("document {document} nests deeper than {limit} levels")]
    TooDeep {
        /// The 1-based index of the document.
        document: usize,
        /// The limit.
        limit: usize,
    },
    /// It is empty where it had content: the state of a file truncated to be rewritten in
    /// place. Delete the file to remove its objects.
    #[error("empty (a file truncated to be rewritten in place)")]
    Emptied,
}

/// One document that could not be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestProblem {
    /// The file.
    pub file: PathBuf,
    /// The document's 1-based index in the file.
    pub document: usize,
    /// The document's `kind`, when it has one.
    pub kind: Option<String>,
    /// Its `metadata.namespace/metadata.name` (or the name alone), when it has one.
    pub name: Option<String>,
    /// What was wrong.
    pub issue: ManifestIssue,
}

impl fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} document {}", self.file.display(), self.document)?;
        match (&self.kind, &self.name) {
            (Some(k), Some(n)) => write!(f, " ({k} {n})")?,
            (Some(k), None) => write!(f, " ({k})")?,
            (None, Some(n)) => write!(f, " ({n})")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.issue)
    }
}

/// What was wrong with one document.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestIssue {
    /// The YAML does not parse. The parser cannot resynchronise, so the rest of the file is not
    /// read either. Only reading texts directly (tests) reports this; a directory load reports
    /// the file as a [`FileFault`] ([`FileIssue::Syntax`]) and does not use it in part.
    #[error("yaml syntax error ({message}); the rest of the file is not read")]
    Syntax {
        /// The parser's message.
        message: String,
    },
    /// The document is not a mapping.
    #[error("the document is not a mapping")]
    NotAnObject,
    /// `apiVersion` or `kind` is missing.
    #[error("{field} is missing")]
    MissingTypeField {
        /// `apiVersion` or `kind`.
        field: &'static str,
    },
    /// A kind the file registry deliberately does not read.
    #[error("{kind} ({api_version}) is not supported by the file registry: {hint}")]
    UnsupportedKind {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
        /// What to write instead.
        hint: &'static str,
    },
    /// A kind the file registry does not know.
    #[error("unknown kind {kind} ({api_version})")]
    UnknownKind {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
    },
    /// The document does not have the kind's shape (the message names the field).
    #[error("invalid {kind}: {message}")]
    Invalid {
        /// The kind it was read as.
        kind: &'static str,
        /// The deserializer's message, with the field path.
        message: String,
    },
    /// The object has the right shape but cannot be converted.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// An earlier document defines the same (kind, namespace, name); this one is skipped.
    #[error("duplicate: already defined in {} document {first_document}; this one is skipped", first_file.display())]
    Duplicate {
        /// The file of the first definition.
        first_file: PathBuf,
        /// Its document index.
        first_document: usize,
    },
}

/// Why a manifest directory could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The directory (or a directory under it) cannot be listed.
    #[error("cannot read manifest directory {}", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: io::Error,
    },
    /// A manifest file cannot be read (or is not UTF-8).
    #[error("cannot read manifest file {}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: io::Error,
    },
}

/// Reads every manifest under `dir` and converts it into a [`Snapshot`] (see the module doc).
/// A file that does not read whole is skipped and reported in [`FileLoad::faults`].
pub fn load_dir(dir: &Path) -> Result<FileLoad, FileError> {
    load_dir_keeping(dir, &mut LastGood::default())
}

/// [`load_dir`] for a reader that keeps `last` across loads: a file that does not read whole
/// is replaced by its content in `last`, and `last` is updated with every file that does.
pub fn load_dir_keeping(dir: &Path, last: &mut LastGood) -> Result<FileLoad, FileError> {
    let mut paths = Vec::new();
    collect_files(dir, &mut paths)?;
    paths.sort();
    let mut files = Vec::with_capacity(paths.len());
    let mut faults = Vec::new();
    let mut present = std::collections::BTreeSet::new();
    for path in paths {
        let read = match std::fs::read(&path) {
            // Removed since the directory was listed: gone, like a file never listed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => Err(FileIssue::Unreadable {
                message: e.to_string(),
            }),
            Ok(bytes) => read_whole(bytes, last.files.get(&path)),
        };
        present.insert(path.clone());
        match read {
            Ok((text, documents)) => {
                last.files.insert(path.clone(), text);
                files.push((path, documents));
            }
            Err(issue) => {
                let kept = last.files.get(&path).map(|text| split_documents(text).0);
                faults.push(FileFault {
                    file: path.clone(),
                    issue,
                    kept_last_good: kept.is_some(),
                });
                if let Some(documents) = kept {
                    files.push((path, documents));
                }
            }
        }
    }
    last.files.retain(|path, _| present.contains(path));
    let mut load = load_documents(files, Vec::new());
    load.faults = faults;
    Ok(load)
}

/// A file's bytes as text and documents, if it is whole: UTF-8, every document parses, and
/// not emptied where its `last` good content had some.
fn read_whole(bytes: Vec<u8>, last: Option<&String>) -> Result<(String, Vec<Value>), FileIssue> {
    let text = String::from_utf8(bytes).map_err(|e| FileIssue::NotUtf8 {
        offset: e.utf8_error().valid_up_to(),
    })?;
    if text.is_empty() && last.is_some_and(|t| !t.is_empty()) {
        return Err(FileIssue::Emptied);
    }
    match split_documents(&text) {
        (documents, None) => Ok((text, documents)),
        (_, Some((document, error))) => Err(match error {
            YamlError::TooLarge { bytes, limit } => FileIssue::TooLarge { bytes, limit },
            YamlError::TooDeep { limit } => FileIssue::TooDeep { document, limit },
            YamlError::Invalid(message) => FileIssue::Syntax { document, message },
        }),
    }
}

impl FileIssue {
    /// A short name of the kind of issue, for a metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unreadable { .. } => "unreadable",
            Self::NotUtf8 { .. } => "not-utf8",
            Self::Syntax { .. } => "syntax",
            Self::TooLarge { .. } => "too-large",
            Self::TooDeep { .. } => "too-deep",
            Self::Emptied => "emptied",
        }
    }
}

/// A file's YAML documents (empty ones as `Null`) up to the first that does not read, and
/// that one's 1-based index and why (within the bounds of [`crate::yaml`]).
pub fn split_documents(text: &str) -> (Vec<Value>, Option<(usize, YamlError)>) {
    crate::yaml::documents_of(text)
}

/// Every `.yaml`/`.yml` file under `dir` (recursively), sorted by path, with its text.
pub fn read_manifests(dir: &Path) -> Result<Vec<(PathBuf, String)>, FileError> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    let mut texts = Vec::with_capacity(files.len());
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| FileError::ReadFile {
            path: path.clone(),
            source,
        })?;
        texts.push((path, text));
    }
    Ok(texts)
}

/// A fingerprint of the manifests under `dir` (their paths and contents), so that a caller
/// that changed the directory can tell when a daemon has loaded exactly that state. Stable
/// within one build of aether (both sides run the same binary); not a security hash.
///
/// It reads bytes: a file that is not UTF-8 or cannot be read is part of the state (by its
/// bytes, or the kind of its error), never a reason to fail.
pub fn fingerprint(dir: &Path) -> Result<u64, FileError> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    let mut paths = Vec::new();
    collect_files(dir, &mut paths)?;
    paths.sort();
    for path in paths {
        let read = match std::fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            other => other,
        };
        path.strip_prefix(dir).unwrap_or(&path).hash(&mut hasher);
        match read {
            Ok(bytes) => bytes.hash(&mut hasher),
            Err(e) => e.kind().hash(&mut hasher),
        }
    }
    Ok(hasher.finish())
}

/// Watches `dir` (recursively) for changes; every change sends a tick on `tx` (capacity 1 is
/// enough: ticks coalesce). Reads of the directory are not changes, so a reader that reloads on
/// a tick does not trigger the next one. `None` (logged) when the watch cannot be set up.
pub fn watch_dir(
    dir: &Path,
    tx: tokio::sync::mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| tracing::error!(error = %e, "registry watcher"))
    .ok()?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|e| tracing::error!(error = %e, dir = %dir.display(), "registry watcher"))
        .ok()?;
    Some(watcher)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), FileError> {
    let read_dir_error = |source| FileError::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_dir_error)? {
        let entry = entry.map_err(read_dir_error)?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(read_dir_error)?;
        if file_type.is_dir() {
            collect_files(&path, out)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml")
        {
            out.push(path);
        }
    }
    Ok(())
}

/// A typed manifest. Boxed: the Kubernetes types are large and differ in size.
#[derive(Debug)]
enum Manifest {
    Pod(Box<K8sPod>),
    Service(Box<K8sService>),
    Namespace(Box<K8sNamespace>),
    ServiceAccount,
    EndpointSlice(Box<K8sEndpointSlice>),
    HttpRoute(Box<GatewayHttpRoute>),
    GrpcRoute(Box<GatewayGrpcRoute>),
    TlsRoute(Box<GatewayTlsRoute>),
    TcpRoute(Box<GatewayTcpRoute>),
    UdpRoute(Box<GatewayUdpRoute>),
    ReferenceGrant(Box<GatewayReferenceGrant>),
    MeshFilter(Box<MeshFilterResource>),
    /// A MeshFilter whose document does not decode (or of a version this build does not read):
    /// kept as an unreadable filter of its whole namespace (issue #35 item 1), and reported.
    UndecodableMeshFilter {
        namespace: String,
        name: String,
        issue: ManifestIssue,
    },
}

/// Where a document came from.
#[derive(Clone, Debug)]
struct Origin {
    file: PathBuf,
    document: usize,
    kind: Option<String>,
    name: Option<String>,
}

impl Origin {
    fn problem(&self, issue: ManifestIssue) -> ManifestProblem {
        ManifestProblem {
            file: self.file.clone(),
            document: self.document,
            kind: self.kind.clone(),
            name: self.name.clone(),
            issue,
        }
    }
}

/// Parses and converts already-read files (pure). Unlike [`load_dir`], a file with a syntax
/// error gives the documents before it (and a [`ManifestIssue::Syntax`] problem).
#[cfg(test)]
fn load_texts(texts: &[(PathBuf, String)]) -> FileLoad {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for (path, text) in texts {
        let (documents, error) = split_documents(text);
        if let Some((document, error)) = error {
            problems.push(ManifestProblem {
                file: path.clone(),
                document,
                kind: None,
                name: None,
                issue: ManifestIssue::Syntax {
                    message: error.to_string(),
                },
            });
        }
        files.push((path.clone(), documents));
    }
    load_documents(files, problems)
}

/// Converts the documents of every file, in order (pure); `problems` are reported first.
fn load_documents(
    files: Vec<(PathBuf, Vec<Value>)>,
    mut problems: Vec<ManifestProblem>,
) -> FileLoad {
    let mut manifests = Vec::new();
    // (kind, "namespace/name"): the namespace is already part of the origin's name.
    let mut seen: BTreeMap<(String, String), (PathBuf, usize)> = BTreeMap::new();
    for (path, documents) in files {
        for (origin, manifest) in read_documents(&path, documents, &mut problems) {
            let key = (
                origin.kind.clone().unwrap_or_default(),
                origin.name.clone().unwrap_or_default(),
            );
            if let Some((first_file, first_document)) = seen.get(&key) {
                problems.push(origin.problem(ManifestIssue::Duplicate {
                    first_file: first_file.clone(),
                    first_document: *first_document,
                }));
                continue;
            }
            seen.insert(key, (origin.file.clone(), origin.document));
            manifests.push((origin, manifest));
        }
    }
    let snapshot = convert_manifests(&manifests, &mut problems);
    FileLoad {
        snapshot,
        problems,
        faults: Vec::new(),
    }
}

/// Reads each document of one file as a typed manifest.
fn read_documents(
    path: &Path,
    documents: Vec<Value>,
    problems: &mut Vec<ManifestProblem>,
) -> Vec<(Origin, Manifest)> {
    let mut out = Vec::new();
    for (i, value) in documents.into_iter().enumerate() {
        let mut origin = Origin {
            file: path.to_path_buf(),
            document: i + 1,
            kind: None,
            name: None,
        };
        if value.is_null() {
            continue; // An empty document (a trailing `---`, a comment-only file).
        }
        match read_manifest(value, &mut origin) {
            Ok(m) => out.push((origin, m)),
            Err(issue) => problems.push(origin.problem(issue)),
        }
    }
    out
}

fn text_field<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(value, |v, key| v.get(key))?.as_str()
}

/// Reads a document's `apiVersion` and `kind`, fills in the default namespace, and deserializes
/// it into its typed manifest. Records the kind and name in `origin` as soon as they are known.
fn read_manifest(mut value: Value, origin: &mut Origin) -> Result<Manifest, ManifestIssue> {
    if !value.is_object() {
        return Err(ManifestIssue::NotAnObject);
    }
    let kind = text_field(&value, &["kind"]).map(str::to_owned);
    origin.kind.clone_from(&kind);
    let api_version = text_field(&value, &["apiVersion"])
        .map(str::to_owned)
        .ok_or(ManifestIssue::MissingTypeField {
            field: "apiVersion",
        })?;
    let kind = kind.ok_or(ManifestIssue::MissingTypeField { field: "kind" })?;
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    let cluster_scoped = group.is_empty() && kind == "Namespace";
    if !cluster_scoped {
        default_namespace(&mut value);
    }
    let name = text_field(&value, &["metadata", "name"]).map(str::to_owned);
    let namespace = text_field(&value, &["metadata", "namespace"]);
    origin.name = match (namespace, name.clone()) {
        (Some(ns), Some(n)) => Some(format!("{ns}/{n}")),
        (_, n) => n,
    };

    let unknown = || ManifestIssue::UnknownKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    };
    match (group, version, kind.as_str()) {
        ("", "v1", "Pod") => typed(&value, "Pod").map(Manifest::Pod),
        ("", "v1", "Service") => typed(&value, "Service").map(Manifest::Service),
        ("", "v1", "Namespace") => typed(&value, "Namespace").map(Manifest::Namespace),
        ("", "v1", "ServiceAccount") => Ok(Manifest::ServiceAccount),
        ("discovery.k8s.io", "v1", "EndpointSlice") => {
            typed(&value, "EndpointSlice").map(Manifest::EndpointSlice)
        }
        (convert::GATEWAY_GROUP, _, "HTTPRoute") => {
            typed(&value, "HTTPRoute").map(Manifest::HttpRoute)
        }
        (convert::GATEWAY_GROUP, _, "GRPCRoute") => {
            typed(&value, "GRPCRoute").map(Manifest::GrpcRoute)
        }
        (convert::GATEWAY_GROUP, _, "TLSRoute") => {
            typed(&value, "TLSRoute").map(Manifest::TlsRoute)
        }
        (convert::GATEWAY_GROUP, _, "TCPRoute") => {
            typed(&value, "TCPRoute").map(Manifest::TcpRoute)
        }
        (convert::GATEWAY_GROUP, _, "UDPRoute") => {
            typed(&value, "UDPRoute").map(Manifest::UdpRoute)
        }
        (convert::GATEWAY_GROUP, _, "ReferenceGrant") => {
            typed(&value, "ReferenceGrant").map(Manifest::ReferenceGrant)
        }
        ("aether.io", _, "MeshFilter") => {
            let decoded = if version == "v1alpha1" {
                typed(&value, "MeshFilter").map(Manifest::MeshFilter)
            } else {
                Err(unknown())
            };
            // A policy this build cannot read could be an authorization: it is kept, by its
            // namespace and name, as one that refuses (issue #35 item 1).
            decoded.or_else(|issue| match (namespace, &name) {
                (Some(ns), Some(n)) if !ns.is_empty() && !n.is_empty() => {
                    Ok(Manifest::UndecodableMeshFilter {
                        namespace: ns.to_owned(),
                        name: n.clone(),
                        issue,
                    })
                }
                _ => Err(issue),
            })
        }
        (
            "apps" | "batch",
            _,
            "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" | "CronJob",
        ) => Err(ManifestIssue::UnsupportedKind {
            api_version: api_version.clone(),
            kind: kind.clone(),
            hint: "the file registry runs no controllers; write the Pods themselves, each with status.podIP",
        }),
        _ => Err(unknown()),
    }
}

/// Sets `metadata.namespace: default` when the document has none.
fn default_namespace(value: &mut Value) {
    let Some(map) = value.as_object_mut() else {
        return;
    };
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(meta) = meta.as_object_mut() {
        let ns = meta.entry("namespace").or_insert(Value::Null);
        if ns.is_null() {
            *ns = Value::from("default");
        }
    }
}

/// Deserializes a document into `T`, with the field path in the error
/// (`spec.ports[0].port: invalid type ...`).
fn typed<T: DeserializeOwned>(value: &Value, kind: &'static str) -> Result<Box<T>, ManifestIssue> {
    serde_path_to_error::deserialize(value)
        .map(Box::new)
        .map_err(|e| ManifestIssue::Invalid {
            kind,
            message: e.to_string(),
        })
}

/// Push a converted object; one the converter refused as `unreadable` makes it, if it makes
/// one, and the refusal is returned to be reported.
fn kept<T>(
    converted: Result<T, ConvertError>,
    unreadable: impl FnOnce(&ConvertError) -> Option<T>,
    into: &mut Vec<T>,
) -> Result<(), ConvertError> {
    match converted {
        Ok(v) => {
            into.push(v);
            Ok(())
        }
        Err(e) => {
            into.extend(unreadable(&e));
            Err(e)
        }
    }
}

/// Converts typed manifests into a snapshot; conversion errors become problems.
fn convert_manifests(
    manifests: &[(Origin, Manifest)],
    problems: &mut Vec<ManifestProblem>,
) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let mut good_pods = Vec::new();
    let mut good_services = Vec::new();
    let mut service_origins = BTreeMap::new();
    for (origin, manifest) in manifests {
        let result = match manifest {
            Manifest::Pod(pod) => convert_pod(&MeshPod::from(&**pod), MissingReadyCondition::Ready)
                .map(|converted| {
                    match converted.registration {
                        Some(Registration::Row(row)) => snapshot.rows.push(Arc::new(row)),
                        Some(Registration::Refused(refused)) => snapshot.refused_pods.push(refused),
                        None => {}
                    }
                    snapshot.pods.push(Arc::new(converted.pod));
                    good_pods.push(pod.as_ref());
                }),
            Manifest::Service(service) => convert_service(service).map(|converted| {
                service_origins.insert(
                    (converted.namespace.clone(), converted.name.clone()),
                    origin,
                );
                snapshot.services.push(converted);
                good_services.push(service.as_ref());
            }),
            Manifest::Namespace(ns) => convert_namespace(ns).map(|n| snapshot.namespaces.push(n)),
            Manifest::ServiceAccount => Ok(()),
            Manifest::EndpointSlice(s) => {
                convert_endpoint_slice(s).map(|s| snapshot.endpoint_slices.push(s))
            }
            // A route the converter refuses is kept as one that routes nowhere (issue #35
            // item 1), and reported.
            Manifest::HttpRoute(r) => kept(
                convert_http_route(r),
                |e| convert::unreadable_http_route(r, e),
                &mut snapshot.http_routes,
            ),
            Manifest::GrpcRoute(r) => kept(
                convert_grpc_route(r),
                |e| convert::unreadable_grpc_route(r, e),
                &mut snapshot.http_routes,
            ),
            Manifest::TlsRoute(r) => kept(
                convert_tls_route(r),
                |e| convert::unreadable_tls_route(r, e),
                &mut snapshot.tls_routes,
            ),
            Manifest::TcpRoute(r) => kept(
                convert_tcp_route(r),
                |e| convert::unreadable_tcp_route(r, e),
                &mut snapshot.tcp_routes,
            ),
            Manifest::UdpRoute(r) => kept(
                convert_udp_route(r),
                |e| convert::unreadable_udp_route(r, e),
                &mut snapshot.udp_routes,
            ),
            Manifest::ReferenceGrant(g) => {
                convert_reference_grant(g).map(|g| snapshot.reference_grants.push(g))
            }
            Manifest::MeshFilter(f) => match convert_mesh_filter(f) {
                Ok(f) => {
                    snapshot.mesh_filters.push(f);
                    Ok(())
                }
                Err(e) => {
                    // Kept as unreadable: the Services it names refuse (issue #35 item 1).
                    snapshot
                        .mesh_filters
                        .extend(convert::unreadable_mesh_filter(f, &e));
                    Err(e)
                }
            },
            Manifest::UndecodableMeshFilter {
                namespace,
                name,
                issue,
            } => {
                snapshot.mesh_filters.push(convert::undecodable_mesh_filter(
                    namespace,
                    name,
                    &issue.to_string(),
                ));
                problems.push(origin.problem(issue.clone()));
                Ok(())
            }
        };
        if let Err(e) = result {
            problems.push(origin.problem(e.into()));
        }
    }
    for slice in endpoint_slices_for(&good_services, &good_pods) {
        match convert_endpoint_slice(&slice) {
            Ok(s) => snapshot.endpoint_slices.push(s),
            Err(e) => {
                // A computed slice only fails when its Service's manifest is odd: blame that.
                let service = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(convert::LABEL_SERVICE_NAME))
                    .cloned()
                    .unwrap_or_default();
                let namespace = slice.metadata.namespace.clone().unwrap_or_default();
                if let Some(origin) = service_origins.get(&(namespace, service)) {
                    problems.push(origin.problem(e.into()));
                }
            }
        }
    }
    snapshot
}
