//! The edit `aether cni install` makes to the node's CNI configuration, as pure functions over
//! file names and text: which file is the primary network ([`primary`]), the file with
//! `aether-cni` as its last plugin ([`insert`]), and the file without it ([`remove`]).
//!
//! The runtime (containerd, CRI-O through libcni) uses the lexically first file of the
//! configuration directory ending in `.conf`, `.conflist` or `.json`; so does [`primary`]. A
//! `.conf` (or `.json`) holding a single plugin is turned into a conflist whose only plugin it
//! is, written as `<stem>.conflist`, and the single-plugin file is removed: the runtime reads a
//! `.conf` as one plugin and would not see the chain.
//!
//! Everything the primary CNI wrote is kept: its keys, its plugins in their order, values
//! exactly (the text is re-serialised, so spacing and key order may change). An edit that would
//! change nothing is [`Edit::Unchanged`], so that re-applying never rewrites the file, and a
//! watcher reacting to its own write stops there.

use serde_json::{Map, Value};

/// The `type` of the plugin, which is also its binary's name in the runtime's `bin` directory.
pub const PLUGIN_TYPE: &str = "aether-cni";

/// The file name endings the runtime reads.
pub const EXTENSIONS: &[&str] = &[".conf", ".conflist", ".json"];

/// What to do to the configuration directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// The file is as it should be.
    Unchanged,
    /// Write `content` to `file` (replacing it), then remove `remove` when it is set (the
    /// single-plugin file a conflist replaced).
    Write {
        /// The file to write, in the configuration directory.
        file: String,
        /// Its new content.
        content: String,
        /// A file to remove after the write.
        remove: Option<String>,
    },
}

/// A configuration file that cannot be edited.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidConf {
    /// Not JSON.
    #[error("{file} is not JSON: {reason}")]
    NotJson {
        /// The file.
        file: String,
        /// The parser's message.
        reason: String,
    },
    /// JSON, but neither a conflist (`plugins`) nor a plugin (`type`).
    #[error("{file} is neither a conflist (a \"plugins\" list) nor a network (a \"type\")")]
    NotANetwork {
        /// The file.
        file: String,
    },
    /// A conflist whose only plugin is ours: there is no primary CNI to chain after.
    #[error("{file} has no plugin but aether-cni: there is no primary CNI to chain after")]
    NoPrimary {
        /// The file.
        file: String,
    },
}

/// The primary network's file among `names` (the directory's file names): the lexically first
/// (byte order, as Go's sort) with a runtime's ending. Temporary files (`.tmp`) and hidden ones
/// never count.
pub fn primary<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .filter(|n| {
            !n.starts_with('.')
                && EXTENSIONS
                    .iter()
                    .any(|e| n.ends_with(e) && n.len() > e.len())
        })
        .min()
}

/// The plugin's own entry: `plugin` (the `--plugin-config` keys) with `type` set to
/// [`PLUGIN_TYPE`].
pub fn entry(plugin: &Map<String, Value>) -> Value {
    let mut entry = plugin.clone();
    entry.insert("type".to_owned(), Value::String(PLUGIN_TYPE.to_owned()));
    Value::Object(entry)
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// A conflist taken apart: its plugins, and every other key.
#[derive(Clone, PartialEq)]
struct Parts {
    list: Map<String, Value>,
    plugins: Vec<Value>,
    /// It was a single plugin, made a conflist.
    converted: bool,
}

impl Parts {
    fn join(mut self) -> Map<String, Value> {
        self.list
            .insert("plugins".to_owned(), Value::Array(self.plugins));
        self.list
    }
}

/// Parse `text` (the content of `file`) as a conflist; a single plugin becomes a one-plugin
/// conflist.
fn as_conflist(file: &str, text: &str) -> Result<Parts, InvalidConf> {
    let value: Value = serde_json::from_str(text).map_err(|e| InvalidConf::NotJson {
        file: file.to_owned(),
        reason: e.to_string(),
    })?;
    let Value::Object(mut map) = value else {
        return Err(InvalidConf::NotANetwork {
            file: file.to_owned(),
        });
    };
    if let Some(Value::Array(plugins)) = map.remove("plugins") {
        return Ok(Parts {
            list: map,
            plugins,
            converted: false,
        });
    }
    if !map.get("type").is_some_and(Value::is_string) {
        return Err(InvalidConf::NotANetwork {
            file: file.to_owned(),
        });
    }
    // A network of one plugin: its name and version go to the list, the rest is the plugin.
    let mut list = Map::new();
    for key in ["cniVersion", "name"] {
        if let Some(v) = map.remove(key) {
            list.insert(key.to_owned(), v);
        }
    }
    Ok(Parts {
        list,
        plugins: vec![Value::Object(map)],
        converted: true,
    })
}

/// The conflist file name for `file`: itself when it is a `.conflist`, `<stem>.conflist`
/// otherwise.
fn conflist_name(file: &str) -> String {
    if file.ends_with(".conflist") {
        return file.to_owned();
    }
    let stem = EXTENSIONS
        .iter()
        .find_map(|e| file.strip_suffix(e))
        .unwrap_or(file);
    format!("{stem}.conflist")
}

/// How the edited files are written: two-space indentation and a final newline.
pub fn render(list: &Map<String, Value>) -> String {
    let mut text = serde_json::to_string_pretty(list).unwrap_or_default();
    text.push('\n');
    text
}

/// The edit that makes `file` (content `text`) end with `entry` (see [`entry`]) as its last
/// plugin, and hold no other `aether-cni` entry.
pub fn insert(file: &str, text: &str, entry: &Value) -> Result<Edit, InvalidConf> {
    let parts = as_conflist(file, text)?;
    let mut edited = parts.clone();
    edited.plugins.retain(|p| !is_ours(p));
    if edited.plugins.is_empty() {
        return Err(InvalidConf::NoPrimary {
            file: file.to_owned(),
        });
    }
    edited.plugins.push(entry.clone());
    if !parts.converted && edited == parts {
        return Ok(Edit::Unchanged);
    }
    let target = conflist_name(file);
    Ok(Edit::Write {
        remove: (target != file).then(|| file.to_owned()),
        file: target,
        content: render(&edited.join()),
    })
}

/// The edit that takes every `aether-cni` entry out of `file` (content `text`).
pub fn remove(file: &str, text: &str) -> Result<Edit, InvalidConf> {
    let mut parts = as_conflist(file, text)?;
    let n = parts.plugins.len();
    parts.plugins.retain(|p| !is_ours(p));
    if parts.converted || parts.plugins.len() == n {
        return Ok(Edit::Unchanged);
    }
    Ok(Edit::Write {
        file: file.to_owned(),
        content: render(&parts.join()),
        remove: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/cni/golden")
    }

    fn read(name: &str) -> String {
        std::fs::read_to_string(golden_dir().join(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    fn golden(name: &str, actual: &str) {
        crate::test_util::golden::assert_golden(&golden_dir().join(name), actual);
    }

    fn ours() -> Value {
        let mut m = Map::new();
        m.insert("socket".into(), "/var/run/aether/cni.sock".into());
        m.insert(
            "ignoredNamespaces".into(),
            serde_json::json!(["kube-system"]),
        );
        entry(&m)
    }

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn the_plugin_goes_last_in_kindnet_calico_and_cilium_conflists_and_comes_out_again() {
        for (input, out) in [
            ("10-kindnet.conflist", "kindnet.inserted.conflist"),
            ("10-calico.conflist", "calico.inserted.conflist"),
            ("05-cilium.conflist", "cilium.inserted.conflist"),
        ] {
            let text = read(&format!("{input}.in"));
            let Edit::Write {
                file,
                content,
                remove: removed,
            } = insert(input, &text, &ours()).unwrap()
            else {
                panic!("{input}: nothing inserted")
            };
            assert_eq!((file.as_str(), removed), (input, None));
            golden(out, &content);
            let edited = json(&content);
            let chain = edited["plugins"].as_array().unwrap();
            assert_eq!(chain.last(), Some(&ours()), "{input}");
            // The primary's plugins, in order and unchanged, then ours.
            let original = json(&text);
            assert_eq!(
                &chain[..chain.len() - 1],
                original["plugins"].as_array().unwrap().as_slice()
            );
            for key in ["cniVersion", "name"] {
                assert_eq!(edited[key], original[key], "{input} {key}");
            }
            // Idempotent: the edited file needs no edit.
            assert_eq!(insert(input, &content, &ours()).unwrap(), Edit::Unchanged);
            // Removing gives back the primary's list.
            let Edit::Write { content: back, .. } = remove(input, &content).unwrap() else {
                panic!("{input}: nothing removed")
            };
            assert_eq!(json(&back), original, "{input}");
            assert_eq!(remove(input, &back).unwrap(), Edit::Unchanged);
        }
    }

    #[test]
    fn an_entry_with_other_settings_or_not_last_is_rewritten_to_one_entry_at_the_end() {
        let text = read("10-kindnet.conflist.in");
        let Edit::Write { content, .. } = insert("a.conflist", &text, &ours()).unwrap() else {
            panic!()
        };
        let mut moved = json(&content);
        let chain = moved["plugins"].as_array_mut().unwrap();
        let mine = chain.pop().unwrap();
        chain.insert(0, mine);
        let mut old = ours();
        old["socket"] = "/old/cni.sock".into();
        chain.push(old);
        let edited = insert("a.conflist", &moved.to_string(), &ours()).unwrap();
        let Edit::Write { content: fixed, .. } = edited else {
            panic!("a misplaced entry was left")
        };
        assert_eq!(fixed, content);
    }

    #[test]
    fn a_single_plugin_conf_becomes_a_conflist_and_the_conf_is_removed() {
        let text = read("10-bridge.conf.in");
        let Edit::Write {
            file,
            content,
            remove: removed,
        } = insert("10-bridge.conf", &text, &ours()).unwrap()
        else {
            panic!()
        };
        assert_eq!(file, "10-bridge.conflist");
        assert_eq!(removed.as_deref(), Some("10-bridge.conf"));
        golden("bridge.inserted.conflist", &content);
        let list = json(&content);
        let mut plugin = json(&text);
        let plugin_map = plugin.as_object_mut().unwrap();
        plugin_map.remove("cniVersion");
        plugin_map.remove("name");
        assert_eq!(list["plugins"][0], plugin);
        assert_eq!(list["cniVersion"], "0.4.0");
        // The conflist written is then the primary and is right.
        assert_eq!(insert(&file, &content, &ours()).unwrap(), Edit::Unchanged);
    }

    #[test]
    fn the_primary_is_the_lexically_first_network_file() {
        let names = [
            "99-loopback.conf",
            "10-kindnet.conflist",
            "05-cilium.conflist.tmp",
            ".10-kindnet.conflist.1.tmp",
            "00-readme.txt",
            "10-calico.json",
            ".conf",
        ];
        assert_eq!(primary(names), Some("10-calico.json"));
        assert_eq!(primary(["b.conflist", "a.conf"]), Some("a.conf"));
        // Go's byte order: "10-a.conf" sorts before "10-a.conflist".
        assert_eq!(primary(["10-a.conflist", "10-a.conf"]), Some("10-a.conf"));
        assert_eq!(primary(["00-readme.txt", "x.conflist.tmp"]), None);
    }

    #[test]
    fn files_that_are_not_networks_are_refused_not_rewritten() {
        for (text, want) in [
            ("{not json", "is not JSON"),
            ("[1,2]", "neither a conflist"),
            (r#"{"name":"x"}"#, "neither a conflist"),
            (
                r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"aether-cni"}]}"#,
                "no plugin but aether-cni",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"x","plugins":[]}"#,
                "no plugin but aether-cni",
            ),
        ] {
            let err = insert("x.conflist", text, &ours()).unwrap_err();
            assert!(err.to_string().contains(want), "{text}: {err}");
        }
    }
}
