//! The daemon's read of a manifest directory (issue #36 item 5): a file over the parser's
//! bounds is refused at once, named in the log and counted by reason, and every other file is
//! read as usual.

use super::*;
use crate::registry::file::LastGood;
use std::collections::BTreeMap;

fn pod(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{serviceAccountName: echo, nodeName: node-a}}\nstatus: {{podIP: {ip}}}\n"
    )
}

#[test]
fn a_deeply_nested_file_is_refused_at_once_counted_and_named() {
    let dir = std::env::temp_dir().join(format!("aether-node-deep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("good.yaml"), pod("good-0", "10.0.0.1")).unwrap();
    // The file of issue #36: 200 KB of nested `[`, which stalled the registry for 25-40 s.
    std::fs::write(dir.join("deep.yaml"), "[".repeat(200_000)).unwrap();
    std::fs::write(dir.join("blocks.yaml"), "- ".repeat(100_000)).unwrap();
    let config = NodeConfig {
        registry: dir.clone(),
        ..NodeConfig::default()
    };
    let stats = NodeStats::default();
    let before = crate::test_util::thread_cpu_micros();
    let (snapshot, _) = read_dir(&config, &mut LastGood::default(), &stats).expect("reads");
    let spent = crate::test_util::thread_cpu_micros() - before;
    assert!(spent < 100_000, "{spent} µs of CPU for the whole directory");
    let pods: Vec<&str> = snapshot.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        pods,
        ["good-0"],
        "the good file is read, the deep ones are not"
    );
    assert_eq!(
        stats
            .registry_file_errors
            .get_or_create(&[("reason", "too-deep")])
            .get(),
        2
    );
    // Named: the fault the log line prints says which file and why.
    let load = crate::registry::file::load_dir(&dir).expect("reads");
    let faults: Vec<String> = load.faults.iter().map(ToString::to_string).collect();
    assert_eq!(faults.len(), 2, "{faults:?}");
    for (fault, file) in faults.iter().zip(["blocks.yaml", "deep.yaml"]) {
        assert!(fault.contains(file), "{fault}");
        assert!(
            fault.contains(&format!(
                "nests deeper than {} levels",
                crate::yaml::MAX_DEPTH
            )),
            "{fault}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #36 item 6: a pod that cannot be served is logged when it fails first or otherwise,
/// and when it is served; the retries that fail as before are summed up once a minute.
#[test]
fn a_pod_not_served_is_logged_once_per_reason_and_its_retries_are_summed_up() {
    let key = |p: &str| ("mp".to_owned(), p.to_owned());
    let failed = |pairs: &[(&str, &str)]| -> BTreeMap<(String, String), String> {
        pairs
            .iter()
            .map(|(p, r)| (key(p), (*r).to_owned()))
            .collect()
    };
    let mut log = NotServedLog::default();
    let t0 = crate::time::now();
    let first = log.record(&failed(&[("a", "no netns"), ("b", "no netns")]), t0);
    assert_eq!(first.failed.len(), 2);
    assert_eq!(first.summary, None);
    // 29 retries of 2 s that fail as before: nothing but one summary line.
    let mut lines = Vec::new();
    for i in 1..30u64 {
        let at = t0 + Duration::from_secs(2 * i);
        lines.push(log.record(&failed(&[("a", "no netns"), ("b", "no netns")]), at));
    }
    assert!(
        lines
            .iter()
            .all(|l| l.failed.is_empty() && l.recovered.is_empty())
    );
    let summaries: Vec<(usize, u64)> = lines.iter().filter_map(|l| l.summary).collect();
    assert_eq!(
        summaries,
        [(2, 2)],
        "the first summary at once, then one a minute"
    );
    // Another reason is logged; a pod served is logged once.
    let t = t0 + Duration::from_secs(62);
    let changed = log.record(&failed(&[("a", "capture failed")]), t);
    assert_eq!(changed.failed, [(key("a"), "capture failed".to_owned())]);
    assert_eq!(changed.recovered, [key("b")]);
    assert_eq!(
        changed.summary,
        Some((1, 56)),
        "the retries since the last summary"
    );
}

/// Issue #36 item 6: each bad file or document was logged again at every reload. The daemon
/// keeps what it reported, logs what is new, and forgets what is fixed.
#[test]
fn a_registry_problem_is_reported_once_until_it_changes() {
    let dir = std::env::temp_dir().join(format!("aether-node-reported-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("good.yaml"), pod("good-0", "10.0.0.1")).unwrap();
    std::fs::write(dir.join("bad.yaml"), "kind: Pod\n").unwrap();
    let config = NodeConfig {
        registry: dir.clone(),
        ..NodeConfig::default()
    };
    let stats = NodeStats::default();
    let mut last = LastGood::default();
    read_dir(&config, &mut last, &stats).expect("reads");
    let first = last.reported.clone();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first.iter().all(|l| l.contains("bad.yaml")), "{first:?}");
    read_dir(&config, &mut last, &stats).expect("reads");
    assert_eq!(last.reported, first, "the same problem, nothing new to log");
    std::fs::write(dir.join("bad.yaml"), pod("bad-0", "10.0.0.2")).unwrap();
    read_dir(&config, &mut last, &stats).expect("reads");
    assert!(last.reported.is_empty(), "{:?}", last.reported);
    let _ = std::fs::remove_dir_all(&dir);
}
