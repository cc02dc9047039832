//! The CNI protocol of `aether cni`, as pure functions (STYLE.md §6.1, principle 1): the
//! environment and stdin go in, what to do comes out. No IO, no clock, no process state: the
//! caller ([`super::plugin`]) reads the environment and stdin, asks the daemon when the
//! [`Plan`] says so, and writes the [`Output`].
//!
//! The protocol is the CNI specification's, versions 0.3.0 to 1.1.0: the command in
//! `CNI_COMMAND`, the container in `CNI_CONTAINERID`, `CNI_NETNS` and `CNI_IFNAME`, kubelet's
//! `K8S_POD_NAMESPACE` and `K8S_POD_NAME` in `CNI_ARGS`, the network configuration as JSON on
//! stdin; a result or an error as JSON on stdout. The plugin is always chained: ADD hands the
//! primary plugin's result (`prevResult`) on unchanged, as a raw JSON value.
//!
//! Every input, hostile ones included (not JSON, not UTF-8, too large, fields of the wrong type),
//! gives a CNI error with a code from the specification, never a panic.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::capture::cni::CniCommand;

/// The versions of the CNI specification the plugin speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest of [`SUPPORTED_VERSIONS`]: the version of an answer to a request that names none
/// the plugin can use.
pub const LATEST: &str = "1.1.0";

/// The largest configuration read from stdin, in bytes (1 MiB). A real one is a few hundred.
pub const MAX_STDIN: usize = 1 << 20;

/// Where the daemon's CNI socket is when the configuration names none (`socket`).
pub const DEFAULT_SOCKET: &str = "/var/run/aether/cni.sock";

/// How long the daemon may take to answer when the configuration does not say (`timeoutSecs`).
/// An ADD is answered once the pod is served, which takes some milliseconds; the bound is for a
/// daemon that hangs.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// The longest `timeoutSecs` accepted, in seconds.
pub const MAX_TIMEOUT_SECS: u64 = 600;

/// The namespaces passed through without asking the daemon when the configuration does not say
/// (`ignoredNamespaces`): the daemon's own pods and the cluster's must start without it.
pub const DEFAULT_IGNORED: &[&str] = &["kube-system"];

/// Error codes of the CNI specification ("Error codes"), and the plugin's own (100 and up).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO: u32 = 5;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later: a transient condition (here, the daemon is not ready, or does not know
    /// the pod yet).
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin is not available (cannot serve ADD).
    pub const NOT_AVAILABLE: u32 = 50;
    /// The daemon handled the request and refused it (the pod cannot be served).
    pub const DAEMON_REFUSED: u32 = 100;
}

/// The CNI environment variables, as read (`None`: unset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Option<String>,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: Option<String>,
    /// `CNI_PATH` (read for completeness: the plugin calls no other plugin).
    pub path: Option<String>,
}

impl CniEnv {
    /// The variables, looked up through `var` (the plugin passes the process environment).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            command: var("CNI_COMMAND"),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
        }
    }
}

/// What the plugin prints and how it exits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The bytes for stdout: a result, a version answer, an error object, or nothing.
    pub stdout: String,
    /// The exit status: 0, or 1 with a CNI error on stdout.
    pub exit: u8,
    /// A note for stderr (the runtime logs it), when something worth saying happened.
    pub note: Option<String>,
}

impl Output {
    fn ok(stdout: String) -> Self {
        Self {
            stdout,
            exit: 0,
            note: None,
        }
    }

    fn error(version: &str, code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        let msg = msg.into();
        let details = details.into();
        let body = serde_json::json!({
            "cniVersion": version,
            "code": code,
            "msg": msg,
            "details": details,
        });
        Self {
            stdout: format!("{body}\n"),
            exit: 1,
            note: Some(if details.is_empty() {
                format!("aether-cni: {msg}")
            } else {
                format!("aether-cni: {msg}: {details}")
            }),
        }
    }

    /// The error object's code, when this is an error.
    pub fn error_code(&self) -> Option<u32> {
        if self.exit == 0 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&self.stdout).ok()?;
        v["code"].as_u64().and_then(|c| u32::try_from(c).ok())
    }
}

/// What to do with one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Print this and exit: no daemon needed.
    Done(Output),
    /// Ask the daemon, then [`finish`].
    Ask(Ask),
}

/// A question for the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The daemon's CNI socket.
    pub socket: PathBuf,
    /// The bound on the whole exchange.
    pub timeout: Duration,
    /// What to send; `None` for STATUS, which only connects.
    pub command: Option<CniCommand>,
    /// The configuration's `cniVersion`, for the answer.
    pub version: String,
    /// For an ADD: the `prevResult` to print once the daemon said yes, as it came.
    pub prev_result: Option<String>,
    /// Which command this answers.
    pub verb: Verb,
}

/// The CNI commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// ADD.
    Add,
    /// DEL.
    Del,
    /// CHECK.
    Check,
    /// GC (1.1.0).
    Gc,
    /// STATUS (1.1.0).
    Status,
    /// VERSION.
    Version,
}

impl Verb {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            "VERSION" => Self::Version,
            _ => return None,
        })
    }
}

/// How asking the daemon went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskError {
    /// The socket is not there or nobody listens on it: the daemon is not running or not ready.
    NotReady(String),
    /// No answer within the bound.
    Timeout(Duration),
    /// The daemon handled the request and said no.
    Refused(String),
    /// The daemon said not yet (its registry does not hold the pod yet): a retry may succeed.
    TryAgain(String),
    /// The exchange broke (a closed connection, an unreadable reply).
    Io(String),
}

/// The answer to VERSION.
pub fn version_answer() -> String {
    let body = serde_json::json!({
        "cniVersion": LATEST,
        "supportedVersions": SUPPORTED_VERSIONS,
    });
    format!("{body}\n")
}

/// The network configuration, as far as the plugin reads it. Unknown keys (the primary
/// plugin's, `runtimeConfig`, `capabilities`) are ignored, as the specification asks.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetConf<'a> {
    cni_version: Option<String>,
    #[serde(borrow)]
    prev_result: Option<&'a RawValue>,
    socket: Option<PathBuf>,
    ignored_namespaces: Option<Vec<String>>,
    timeout_secs: Option<u64>,
}

/// The part of a result (0.3.0 to 1.1.0 share it) the plugin reads: the addresses of the
/// interfaces inside the sandbox.
#[derive(Debug, Deserialize)]
struct PrevResult {
    #[serde(default)]
    interfaces: Vec<ResultInterface>,
    #[serde(default)]
    ips: Vec<ResultIp>,
}

#[derive(Debug, Deserialize)]
struct ResultInterface {
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ResultIp {
    address: String,
    #[serde(default)]
    interface: Option<usize>,
}

/// The pod's addresses in a result: every `ips[].address` whose interface is inside the
/// sandbox (or names no interface), without its prefix length.
fn pod_ips(prev: &RawValue) -> Result<Vec<IpAddr>, String> {
    let r: PrevResult = serde_json::from_str(prev.get()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for ip in &r.ips {
        let in_sandbox = match ip.interface {
            None => true,
            Some(i) => r
                .interfaces
                .get(i)
                .is_some_and(|iface| iface.sandbox.as_deref().is_some_and(|s| !s.is_empty())),
        };
        if !in_sandbox {
            continue;
        }
        let addr = match ip.address.parse::<ipnet::IpNet>() {
            Ok(net) => net.addr(),
            Err(_) => ip
                .address
                .parse::<IpAddr>()
                .map_err(|_| format!("ips[].address {:?} is not an address", ip.address))?,
        };
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

/// `CNI_ARGS` as key/value pairs (`K=V;K=V`). A pair without `=` is invalid.
fn parse_args(args: &str) -> Result<BTreeMap<&str, &str>, String> {
    let mut out = BTreeMap::new();
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("CNI_ARGS pair {pair:?} has no '='"))?;
        out.insert(k, v);
    }
    Ok(out)
}

/// The version order of two supported versions.
fn at_least(version: &str, min: &str) -> bool {
    let key = |v: &str| SUPPORTED_VERSIONS.iter().position(|s| *s == v);
    key(version) >= key(min)
}

/// Decide what one invocation does: `env` is the CNI environment, `stdin` what the runtime
/// wrote (at most [`MAX_STDIN`] + 1 bytes of it: more is an error).
///
/// The steps, in order (the first that answers ends it): the command, VERSION's answer, the
/// configuration, the commands whose version it does not allow (and GC and STATUS, which name
/// no pod), the pod, and last the question for the daemon.
pub fn plan(env: &CniEnv, stdin: &[u8]) -> Plan {
    let (command, verb) = match read_command(env) {
        Ok(c) => c,
        Err(refused) => return Plan::Done(refused),
    };
    // VERSION answers whatever the configuration says (libcni sends only `cniVersion`).
    if verb == Verb::Version {
        return Plan::Done(Output::ok(version_answer()));
    }
    let call = match Invocation::read(env, command, verb, stdin) {
        Ok(c) => c,
        Err(refused) => return Plan::Done(refused),
    };
    if let Some(answered) = call.answer_without_a_pod() {
        return answered;
    }
    match call.pod() {
        Ok((namespace, pod)) => call.ask_about(namespace, pod),
        Err(answered) => Plan::Done(answered),
    }
}

/// `CNI_COMMAND`, as written and as a [`Verb`]; the error to print when it is unset or unknown.
fn read_command(env: &CniEnv) -> Result<(&str, Verb), Output> {
    let Some(command) = env.command.as_deref() else {
        return Err(Output::error(
            LATEST,
            code::INVALID_ENV,
            "CNI_COMMAND is not set",
            "aether-cni is a CNI plugin: the container runtime runs it",
        ));
    };
    let Some(verb) = Verb::parse(command) else {
        return Err(Output::error(
            LATEST,
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {command:?}"),
            "",
        ));
    };
    Ok((command, verb))
}

/// The network configuration on `stdin` and its supported `cniVersion`; the error to print when
/// it is too large, not UTF-8, not JSON, or of a version the plugin does not speak.
fn read_conf(stdin: &[u8]) -> Result<(NetConf<'_>, String), Output> {
    if stdin.len() > MAX_STDIN {
        return Err(Output::error(
            LATEST,
            code::DECODE,
            format!("the network configuration is larger than {MAX_STDIN} bytes"),
            "",
        ));
    }
    let text = std::str::from_utf8(stdin).map_err(|e| {
        Output::error(
            LATEST,
            code::DECODE,
            "the network configuration is not UTF-8",
            e.to_string(),
        )
    })?;
    let conf: NetConf<'_> = serde_json::from_str(text).map_err(|e| {
        Output::error(
            LATEST,
            code::DECODE,
            "the network configuration is not valid JSON",
            e.to_string(),
        )
    })?;
    let version = match conf.cni_version.as_deref() {
        Some(v) if SUPPORTED_VERSIONS.contains(&v) => v.to_owned(),
        other => {
            return Err(Output::error(
                LATEST,
                code::INCOMPATIBLE_VERSION,
                match other {
                    Some(v) => format!("incompatible CNI version {v:?}"),
                    None => "the network configuration has no cniVersion".to_owned(),
                },
                format!("aether-cni supports {}", SUPPORTED_VERSIONS.join(", ")),
            ));
        }
    };
    Ok((conf, version))
}

/// One invocation whose command and configuration were read: what the later steps of [`plan`]
/// decide from, and answer in its `cniVersion`.
struct Invocation<'a> {
    env: &'a CniEnv,
    /// `CNI_COMMAND` as written.
    command: &'a str,
    verb: Verb,
    conf: NetConf<'a>,
    /// The configuration's `cniVersion`, one of [`SUPPORTED_VERSIONS`].
    version: String,
    socket: PathBuf,
    timeout: Duration,
}

impl<'a> Invocation<'a> {
    /// The invocation of `command` with the configuration on `stdin`, or the error to print.
    fn read(
        env: &'a CniEnv,
        command: &'a str,
        verb: Verb,
        stdin: &'a [u8],
    ) -> Result<Self, Output> {
        let (conf, version) = read_conf(stdin)?;
        let timeout = match conf.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(s) if (1..=MAX_TIMEOUT_SECS).contains(&s) => Duration::from_secs(s),
            Some(s) => {
                return Err(Output::error(
                    &version,
                    code::INVALID_CONFIG,
                    format!("timeoutSecs {s} is out of range"),
                    format!("1 to {MAX_TIMEOUT_SECS}"),
                ));
            }
        };
        let socket = conf
            .socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        Ok(Self {
            env,
            command,
            verb,
            conf,
            version,
            socket,
            timeout,
        })
    }

    /// A CNI error in the configuration's version.
    fn fail(&self, code: u32, msg: String, details: String) -> Output {
        Output::error(&self.version, code, msg, details)
    }

    /// The question for the daemon.
    fn ask(&self, command: Option<CniCommand>, prev_result: Option<String>) -> Plan {
        Plan::Ask(Ask {
            socket: self.socket.clone(),
            timeout: self.timeout,
            command,
            version: self.version.clone(),
            prev_result,
            verb: self.verb,
        })
    }

    /// The error for a command that needs cniVersion `min` or later, when the configuration's is
    /// older.
    fn needs(&self, min: &str) -> Option<Plan> {
        (!at_least(&self.version, min)).then(|| {
            Plan::Done(self.fail(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "{} needs cniVersion {min} or later, not {}",
                    self.command, self.version
                ),
                String::new(),
            ))
        })
    }

    /// The plan of a command that names no pod (GC, STATUS), or of one the configuration's
    /// version does not have (GC, STATUS, CHECK); `None` for ADD, DEL and CHECK, which go on.
    fn answer_without_a_pod(&self) -> Option<Plan> {
        match self.verb {
            Verb::Gc => Some(self.needs("1.1.0").unwrap_or_else(|| {
                // Nothing to collect: the daemon forgets a pod at DEL, and drops records whose
                // namespace is gone when it starts.
                Plan::Done(Output::ok(String::new()))
            })),
            Verb::Status => Some(self.needs("1.1.0").unwrap_or_else(|| self.ask(None, None))),
            Verb::Check => self.needs("0.4.0"),
            Verb::Add | Verb::Del | Verb::Version => None,
        }
    }

    /// The pod (namespace, name) that ADD, DEL or CHECK is about; otherwise what to print: an
    /// error (a variable missing, an ADD without `prevResult`, unreadable `CNI_ARGS`), or the
    /// success of a container the mesh leaves alone.
    fn pod(&self) -> Result<(String, String), Output> {
        let (env, verb) = (self.env, self.verb);
        // ADD, DEL and CHECK name a container.
        let missing: Vec<&str> = [
            ("CNI_CONTAINERID", &env.container_id),
            ("CNI_IFNAME", &env.ifname),
        ]
        .into_iter()
        .chain((verb != Verb::Del).then_some(("CNI_NETNS", &env.netns)))
        .filter(|(_, v)| v.as_deref().is_none_or(str::is_empty))
        .map(|(k, _)| k)
        .collect();
        if !missing.is_empty() {
            return Err(self.fail(
                code::INVALID_ENV,
                format!("{} not set", missing.join(", ")),
                String::new(),
            ));
        }
        if verb == Verb::Add && self.conf.prev_result.is_none() {
            return Err(self.fail(
                code::INVALID_CONFIG,
                "no prevResult: aether-cni must be chained after the primary CNI plugin".to_owned(),
                "list it after the primary plugin in the node's .conflist (aether cni install)"
                    .to_owned(),
            ));
        }
        let args = parse_args(env.args.as_deref().unwrap_or_default())
            .map_err(|e| self.fail(code::INVALID_ENV, e, String::new()))?;
        let pod = match (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some((*ns, *name)),
            _ => None,
        };
        let ignored = self.conf.ignored_namespaces.as_ref().map_or_else(
            || pod.is_some_and(|(ns, _)| DEFAULT_IGNORED.contains(&ns)),
            |list| pod.is_some_and(|(ns, _)| list.iter().any(|i| i == ns)),
        );
        match pod {
            Some((namespace, name)) if !ignored => Ok((namespace.to_owned(), name.to_owned())),
            // Not a Kubernetes pod, or one the mesh never manages: through, without the daemon.
            _ => Err(Output::ok(match verb {
                Verb::Add => self.prev_result().unwrap_or_default() + "\n",
                _ => String::new(),
            })),
        }
    }

    /// The configuration's `prevResult`, as it came.
    fn prev_result(&self) -> Option<String> {
        self.conf.prev_result.map(|p| p.get().to_owned())
    }

    /// The question for the daemon about the pod `namespace`/`pod` (ADD, DEL, CHECK), or the
    /// error of an ADD whose `prevResult` is not a result.
    fn ask_about(&self, namespace: String, pod: String) -> Plan {
        let netns = self
            .env
            .netns
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(PathBuf::from);
        match self.verb {
            Verb::Add => {
                let ips = match self.conf.prev_result.map(pod_ips).transpose() {
                    Ok(ips) => ips.unwrap_or_default(),
                    Err(e) => {
                        return Plan::Done(self.fail(
                            code::DECODE,
                            "prevResult is not a CNI result".to_owned(),
                            e,
                        ));
                    }
                };
                self.ask(
                    Some(CniCommand::Add {
                        namespace,
                        pod,
                        netns: netns.unwrap_or_default(),
                        ips,
                    }),
                    self.prev_result(),
                )
            }
            Verb::Del => self.ask(
                Some(CniCommand::Del {
                    namespace,
                    pod,
                    netns,
                }),
                None,
            ),
            Verb::Check => self.ask(
                Some(CniCommand::Check {
                    namespace,
                    pod,
                    netns,
                }),
                None,
            ),
            Verb::Gc | Verb::Status | Verb::Version => Plan::Done(Output::ok(String::new())),
        }
    }
}

/// What the plugin prints once the daemon answered `ask` with `outcome`.
pub fn finish(ask: &Ask, outcome: Result<(), AskError>) -> Output {
    let version = ask.version.as_str();
    let what = match ask.verb {
        Verb::Add => "ADD",
        Verb::Del => "DEL",
        Verb::Check => "CHECK",
        Verb::Status => "STATUS",
        Verb::Gc | Verb::Version => "the request",
    };
    let socket = ask.socket.display();
    match (ask.verb, outcome) {
        (Verb::Add, Ok(())) => Output::ok(ask.prev_result.clone().unwrap_or_default() + "\n"),
        (_, Ok(())) => Output::ok(String::new()),
        // DEL does not fail (the specification: a DEL of what is gone succeeds). A daemon that
        // is not running has nothing to forget; one that starts again drops the record.
        (Verb::Del, Err(e)) => Output {
            stdout: String::new(),
            exit: 0,
            note: Some(format!(
                "aether-cni: DEL not told to the daemon ({}): {}",
                socket,
                describe(&e)
            )),
        },
        (Verb::Status, Err(e)) => Output::error(
            version,
            code::NOT_AVAILABLE,
            "the aether daemon is not available: ADD would fail",
            format!("{socket}: {}", describe(&e)),
        ),
        (_, Err(e @ (AskError::NotReady(_) | AskError::Timeout(_)))) => Output::error(
            version,
            code::TRY_AGAIN,
            format!(
                "the aether daemon is not ready; {what} fails so that no pod starts uncaptured"
            ),
            format!("{socket}: {}", describe(&e)),
        ),
        (_, Err(AskError::TryAgain(reason))) => Output::error(
            version,
            code::TRY_AGAIN,
            format!(
                "the aether daemon cannot serve the pod yet; {what} fails so that no pod starts uncaptured"
            ),
            reason,
        ),
        (_, Err(AskError::Refused(reason))) => Output::error(
            version,
            code::DAEMON_REFUSED,
            format!("the aether daemon refused {what}"),
            reason,
        ),
        (_, Err(e @ AskError::Io(_))) => Output::error(
            version,
            code::IO,
            format!("talking to the aether daemon failed; {what} fails"),
            format!("{socket}: {}", describe(&e)),
        ),
    }
}

fn describe(e: &AskError) -> String {
    match e {
        AskError::NotReady(why) => format!("no daemon listens: {why}"),
        AskError::Timeout(t) => format!("no answer within {t:?}"),
        AskError::Refused(why) => format!("refused: {why}"),
        AskError::TryAgain(why) => format!("not yet: {why}"),
        AskError::Io(why) => why.clone(),
    }
}

#[cfg(test)]
mod tests;
