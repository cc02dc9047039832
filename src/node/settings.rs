//! One definition per setting of `aether node` (issue #38): `node::config` lists each setting
//! once in `settings!`, and that one entry gives
//!
//! - the config file's key and the field of [`NodeConfig`](super::NodeConfig), with its default;
//! - the flag (`--key-with-dashes`) and the environment variable of
//!   [`NodeArgs`](super::config::NodeArgs), which override the file;
//! - the checks that need nothing but the value (`at_least`, `range`);
//! - the row of docs/node.md's settings table, or of its limits table with the limit's counter
//!   and why its default is what it is ([`SETTINGS`](super::config::SETTINGS); a test in
//!   `node::config` keeps the document equal to them).
//!
//! This module knows no setting: the macro is expanded in `node::config`.
//!
//! A setting's doc comment is its meaning in the settings table, and for a limit what happens at
//! the limit; the flag's help is the same text.

use std::fmt::Write as _;

/// One setting as docs/node.md shows it; `C` is the config struct that holds it.
pub struct Setting<C> {
    /// The file key; the flag is it with dashes.
    pub key: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// How a list is written in the environment variable, e.g. `comma-separated CIDRs`.
    pub list: Option<&'static str>,
    /// The default as the table shows it in place of the value itself (a required setting, a
    /// default that is found at run time).
    pub shown: Option<&'static str>,
    /// The unit of a number, said after the default.
    pub unit: Option<&'static str>,
    /// The least and the most a number may be (`0` and `u64::MAX`: any), checked at start
    /// and said after the default.
    pub bounds: (u64, u64),
    /// Said after the default, with its unit and bounds: another bound, a special value.
    pub note: Option<&'static str>,
    /// The meaning; for a limit, what happens at it.
    pub meaning: &'static str,
    /// Its row of the limits table, for a limit.
    pub limit: Option<Limit>,
    /// The value in `config`, as the file would spell it.
    pub value: fn(&C) -> serde_json::Value,
}

impl<C> std::fmt::Debug for Setting<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setting")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What the limits table says of a limit besides its default and what happens at it.
#[derive(Debug)]
pub struct Limit {
    /// The counter (or gauge) that shows the limit being reached, `—` for none.
    pub counter: &'static str,
    /// Why the default is what it is.
    pub why: &'static str,
}

/// Define every setting: the config struct, the flags, the value checks and the docs rows.
///
/// Each entry is its meaning (doc comment), then `plain` or `optional` (a setting that may be
/// absent: `Option<T>` in the file, no default), the key, the type and the default, then the
/// environment variable and, in this order, any of: `list "how"` (a comma-separated list in the
/// environment and flag), `shown "text"` (shown in place of the default), `unit "name"`,
/// `at_least N`, `at_most N`, `range A..=B` (checked at start, and said in the docs), `note
/// "text"` (said after the default), and `limit { counter: "…", why: "…" }` for a row of the
/// limits table.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $kind:ident $key:ident: $ty:ty = $default:expr,
            env $env:literal
            $(, list $list:literal)?
            $(, shown $shown:literal)?
            $(, unit $unit:literal)?
            $(, at_least $min:literal)?
            $(, at_most $max:literal)?
            $(, range $lo:literal ..= $hi:literal)?
            $(, note $note:literal)?
            $(, limit { counter: $counter:literal, why: $why:literal })?;
    )*) => {
        /// Every setting of `aether node` (docs/node.md): defaults, then a YAML file, then the
        /// environment and flags ([`NodeArgs::apply`]).
        #[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct NodeConfig {
            $(
                $(#[doc = $doc])+
                pub $key: settings!(@field $kind $ty),
            )*
        }

        impl Default for NodeConfig {
            fn default() -> Self {
                Self { $($key: $default,)* }
            }
        }

        /// Every `aether node` setting as a flag with its environment variable; each given one
        /// overrides the config file.
        #[derive(Clone, Debug, Default, clap::Args)]
        pub struct NodeArgs {
            /// A YAML config file (keys as in docs/node.md).
            #[arg(long, env = "AETHER_CONFIG")]
            pub config: Option<std::path::PathBuf>,
            $(
                $(#[doc = $doc])+
                #[arg(
                    long,
                    env = $env
                    $(, value_delimiter = $crate::node::settings::comma($list))?
                )]
                pub $key: Option<$ty>,
            )*
        }

        impl NodeArgs {
            /// The flags and environment variables given, over `config`.
            pub fn apply(&self, config: &mut NodeConfig) {
                $(
                    if let Some(value) = &self.$key {
                        config.$key = settings!(@given $kind value.clone());
                    }
                )*
            }
        }

        /// Every setting, in the order of docs/node.md's tables.
        pub const SETTINGS: &[$crate::node::settings::Setting<NodeConfig>] = &[$(
            $crate::node::settings::Setting {
                key: stringify!($key),
                env: $env,
                list: settings!(@some $($list)?),
                shown: settings!(@some $($shown)?),
                unit: settings!(@some $($unit)?),
                bounds: settings!(@bounds $(least $min)? $(most $max)? $(range $lo $hi)?),
                note: settings!(@some $($note)?),
                meaning: concat!($($doc),+),
                limit: settings!(@limit $($counter, $why)?),
                value: |c| serde_json::to_value(&c.$key).unwrap_or_default(),
            },
        )*];
    };
    (@field plain $ty:ty) => { $ty };
    (@field optional $ty:ty) => { Option<$ty> };
    (@given plain $value:expr) => { $value };
    (@given optional $value:expr) => { Some($value) };
    (@some) => { None };
    (@some $text:literal) => { Some($text) };
    (@bounds) => { (0, u64::MAX) };
    (@bounds least $min:literal) => { ($min, u64::MAX) };
    (@bounds most $max:literal) => { (0, $max) };
    (@bounds least $min:literal most $max:literal) => { ($min, $max) };
    (@bounds range $lo:literal $hi:literal) => { ($lo, $hi) };
    (@limit) => { None };
    (@limit $counter:literal, $why:literal) => {
        Some($crate::node::settings::Limit { counter: $counter, why: $why })
    };
}
pub(crate) use settings;

/// The delimiter of a list setting's flag and environment variable; `how` is for the docs.
pub const fn comma(how: &'static str) -> char {
    let _ = how;
    ','
}

/// Every value within its definition's bounds, or the first that is not: its key and what is
/// wrong. A bounded setting that is not a number is out of them.
pub fn check_bounds<C>(settings: &[Setting<C>], config: &C) -> Result<(), (&'static str, String)> {
    for s in settings {
        let (least, most) = s.bounds;
        if (least, most) == (0, u64::MAX) {
            continue;
        }
        let value = (s.value)(config);
        let Some(n) = value.as_u64() else {
            return Err((s.key, format!("{value} is not a number")));
        };
        if (least..=most).contains(&n) {
            continue;
        }
        let message = match (least, most) {
            (1, u64::MAX) => "must be at least 1".to_owned(),
            (_, u64::MAX) => format!("{n} is less than {least}"),
            (0, _) => format!("{n} is more than {most}"),
            _ => format!("{n} is not from {least} to {most}"),
        };
        return Err((s.key, message));
    }
    Ok(())
}

/// The header of docs/node.md's settings table.
pub const SETTINGS_HEADER: &str =
    "| key (flag `--key-with-dashes`) | environment | default | meaning |\n|---|---|---|---|\n";

/// The header of docs/node.md's limits table.
pub const LIMITS_HEADER: &str = "| setting (environment) | default | at the limit | counter | \
    why this default |\n|---|---|---|---|---|\n";

/// docs/node.md's settings table, header and rows, from the definitions and the defaults.
pub fn settings_table<C>(settings: &[Setting<C>], defaults: &C) -> String {
    let mut out = SETTINGS_HEADER.to_owned();
    for s in settings.iter().filter(|s| s.limit.is_none()) {
        let list = s.list.map(|how| format!(" ({how})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "| `{}` | `{}`{list} | {} | {} |",
            s.key,
            s.env,
            shown_default(s, defaults),
            s.meaning.trim()
        );
    }
    out
}

/// docs/node.md's limits table, header and rows, from the definitions and the defaults.
pub fn limits_table<C>(settings: &[Setting<C>], defaults: &C) -> String {
    let mut out = LIMITS_HEADER.to_owned();
    for s in settings {
        let Some(limit) = &s.limit else { continue };
        let _ = writeln!(
            out,
            "| `{}` (`{}`) | {} | {} | {} | {} |",
            s.key,
            s.env,
            shown_default(s, defaults),
            s.meaning.trim(),
            limit.counter,
            limit.why
        );
    }
    out
}

/// The default column: the value (or what the definition shows instead), then its unit, its
/// bounds and the note in parentheses.
fn shown_default<C>(s: &Setting<C>, defaults: &C) -> String {
    let value = match s.shown {
        Some(shown) => shown.to_owned(),
        None => match (s.value)(defaults) {
            serde_json::Value::Null => "—".to_owned(),
            serde_json::Value::String(text) if text.is_empty() => "empty".to_owned(),
            serde_json::Value::String(text) => format!("`{text}`"),
            serde_json::Value::Array(items) if items.is_empty() => "empty".to_owned(),
            serde_json::Value::Array(items) => {
                let items: Vec<String> = items
                    .iter()
                    .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                    .collect();
                format!("`[{}]`", items.join(", "))
            }
            other => format!("`{other}`"),
        },
    };
    let bounds = match s.bounds {
        (0 | 1, u64::MAX) => None,
        (least, u64::MAX) => Some(format!("at least `{least}`")),
        (0, most) => Some(format!("at most `{most}`")),
        (least, most) => Some(format!("{least} to {most}")),
    };
    let said: Vec<String> = [s.unit.map(str::to_owned), bounds, s.note.map(str::to_owned)]
        .into_iter()
        .flatten()
        .collect();
    if said.is_empty() {
        value
    } else {
        format!("{value} ({})", said.join(", "))
    }
}
