//! A small mutation fuzzer on the stable toolchain: corpus replay, then a bounded random pass.
//!
//! No coverage feedback (that needs libFuzzer's instrumentation, nightly only). What stands in
//! for it is *outcome* feedback: each target returns a signature of what it decided (the sniff
//! verdict, the DNS response code, the refusal reason...), and a mutated input that produced a
//! signature not seen before joins the pool that later mutations start from. Everything is
//! driven by one seeded RNG, so a seed replays the same inputs in the same order.
//!
//! Why hand-written: the crates that mutate a seed corpus (libFuzzer through cargo-fuzz, AFL,
//! honggfuzz, LibAFL) need nightly, a C toolchain step or a runtime of their own; the stable
//! test-time engines (proptest, bolero's random engine) generate values from a type instead of
//! mutating a corpus of real wire bytes. What is needed here is ~200 lines.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use aether::time::now;
use arc_swap::ArcSwap;

/// One fuzz target: a name (its corpus is `tests/fuzz/corpus/<name>/`), its input bound, the
/// tokens worth inserting, and the function under test. `run` panics on a finding (a panic of
/// the code under test, or a failed property) and otherwise returns a signature of the outcome.
pub(crate) struct Target {
    /// The corpus directory's name and the name in reports.
    pub(crate) name: &'static str,
    /// Inputs are cut to this many bytes.
    pub(crate) max_len: usize,
    /// Tokens of this target's format (inserted and overwritten by the mutator).
    pub(crate) dict: &'static [&'static [u8]],
    /// The function under test.
    pub(crate) run: fn(&[u8]) -> u64,
}

/// The run's bounds, from the environment.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// `AETHER_FUZZ_SECS`: the random pass's length per target, in seconds (default 2).
    pub(crate) secs: f64,
    /// `AETHER_FUZZ_RUNS`: an optional bound on the random pass's executions.
    pub(crate) runs: Option<u64>,
    /// `AETHER_FUZZ_SEED`: the seed (default fixed; `random` picks one).
    pub(crate) seed: u64,
    /// `AETHER_FUZZ_HANG_SECS`: an input that runs this long is a finding (default 30).
    pub(crate) hang_secs: u64,
}

/// The default seed: the same inputs on every run unless `AETHER_FUZZ_SEED` says otherwise.
pub(crate) const DEFAULT_SEED: u64 = 0xae7e_2008_f022_0001;

impl Config {
    /// Reads the bounds; a malformed variable fails the test, naming it.
    pub(crate) fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let secs = var("AETHER_FUZZ_SECS").map_or(2.0, |v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or_else(|| {
                    panic!("AETHER_FUZZ_SECS={v:?}: expected seconds, e.g. 2 or 0.5")
                })
        });
        let runs = var("AETHER_FUZZ_RUNS").map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("AETHER_FUZZ_RUNS={v:?}: expected a count"))
        });
        let seed = match var("AETHER_FUZZ_SEED") {
            None => DEFAULT_SEED,
            Some(v) if v.trim() == "random" => fastrand::u64(..),
            Some(v) => parse_seed(v.trim()).unwrap_or_else(|| {
                panic!("AETHER_FUZZ_SEED={v:?}: expected a number, 0x-hex, or random")
            }),
        };
        let hang_secs = var("AETHER_FUZZ_HANG_SECS").map_or(30, |v| {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|s| *s > 0)
                .unwrap_or_else(|| panic!("AETHER_FUZZ_HANG_SECS={v:?}: expected seconds"))
        });
        Self {
            secs,
            runs,
            seed,
            hang_secs,
        }
    }
}

fn parse_seed(v: &str) -> Option<u64> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => v.replace('_', "").parse().ok(),
    }
}

/// FNV-1a, 64 bits: a stable name for an input (file names) and a per-target seed offset.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a run did, for the summary line and docs/fuzzing.md.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    /// Corpus files replayed.
    pub(crate) corpus: usize,
    /// Random executions.
    pub(crate) execs: u64,
    /// Time spent in the random pass.
    pub(crate) elapsed: Duration,
    /// Inputs in the pool at the end (corpus plus inputs with a new outcome).
    pub(crate) pool: usize,
    /// Distinct outcome signatures seen.
    pub(crate) outcomes: usize,
    /// The seed of the random pass (the run's seed mixed with the target's name).
    pub(crate) seed: u64,
}

/// Shared with the watchdog: progress and the input being run.
struct Watch {
    execs: AtomicU64,
    current: ArcSwap<Vec<u8>>,
    done: AtomicBool,
}

/// Tells the watchdog to stop when dropped.
struct Stop(Arc<Watch>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Relaxed);
    }
}

/// The corpus of a target, sorted by file name; an empty or missing corpus fails the test.
pub(crate) fn corpus(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "fuzz corpus {} is empty", dir.display());
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// Replays the target's corpus, then mutates it until the time (or run) bound.
pub(crate) fn fuzz(target: &Target) -> Summary {
    let config = Config::from_env();
    let seed = config.seed ^ fnv(target.name.as_bytes());
    let watch = Arc::new(Watch {
        execs: AtomicU64::new(0),
        current: ArcSwap::from_pointee(Vec::new()),
        done: AtomicBool::new(false),
    });
    let dog = watchdog(
        target.name,
        config.seed,
        config.hang_secs,
        Arc::clone(&watch),
    );
    // Stops the watchdog however this function ends, a reported failure (a panic) included:
    // otherwise it would take the finished target for a hang and abort the other targets.
    let _stop = Stop(Arc::clone(&watch));

    let mut seen = HashSet::new();
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let files = corpus(target.name);
    for (path, bytes) in &files {
        let outcome = run_one(target, &watch, bytes).unwrap_or_else(|message| {
            fail(
                target,
                bytes,
                &format!("corpus file {}", path.display()),
                config.seed,
                &message,
            )
        });
        seen.insert(outcome);
        pool.push(bytes.clone());
    }

    let mut rng = fastrand::Rng::with_seed(seed);
    let started = now();
    let budget = Duration::from_secs_f64(config.secs);
    let mut execs = 0u64;
    while started.elapsed() < budget && config.runs.is_none_or(|r| execs < r) {
        let parent = &pool[rng.usize(..pool.len())];
        let input = mutate(&mut rng, parent, &pool, target);
        execs += 1;
        match run_one(target, &watch, &input) {
            Ok(outcome) => {
                if seen.insert(outcome) && pool.len() < MAX_POOL {
                    pool.push(input);
                }
            }
            Err(message) => fail(
                target,
                &input,
                &format!("random execution {execs}"),
                config.seed,
                &message,
            ),
        }
    }
    let elapsed = started.elapsed();
    watch.done.store(true, Ordering::Relaxed);
    let _ = dog.join();
    let summary = Summary {
        corpus: files.len(),
        execs,
        elapsed,
        pool: pool.len(),
        outcomes: seen.len(),
        seed: config.seed,
    };
    #[allow(clippy::print_stderr)] // The figures docs/fuzzing.md quotes (seen with --nocapture).
    {
        eprintln!(
            "fuzz {}: {} corpus files replayed; {} random executions in {:.1} s ({:.0}/s); \
             {} distinct outcomes; pool {}; AETHER_FUZZ_SEED={:#x}",
            target.name,
            summary.corpus,
            summary.execs,
            summary.elapsed.as_secs_f64(),
            summary.execs as f64 / summary.elapsed.as_secs_f64().max(1e-9),
            summary.outcomes,
            summary.pool,
            summary.seed,
        );
    }
    summary
}

/// Inputs that produced a new outcome are kept up to this many.
const MAX_POOL: usize = 1024;

fn run_one(target: &Target, watch: &Watch, input: &[u8]) -> Result<u64, String> {
    watch.current.store(Arc::new(input.to_vec()));
    let result = panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    watch.execs.fetch_add(1, Ordering::Relaxed);
    result.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned())
    })
}

/// Where failing inputs are written: `<target dir>/fuzz-failures/`.
fn failures_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is `<target dir>/tmp`.
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("fuzz-failures")
}

fn save(name: &str, kind: &str, input: &[u8]) -> PathBuf {
    let dir = failures_dir();
    let path = dir.join(format!("{name}-{kind}{:016x}", fnv(input)));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input)) {
        #[allow(clippy::print_stderr)] // The input is printed below all the same.
        {
            eprintln!("could not write {}: {e}", path.display());
        }
    }
    path
}

fn hex(input: &[u8]) -> String {
    const SHOWN: usize = 512;
    let mut s: String = input
        .iter()
        .take(SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect();
    if input.len() > SHOWN {
        s.push_str(&format!("... ({} bytes in all)", input.len()));
    }
    s
}

fn fail(target: &Target, input: &[u8], which: &str, seed: u64, message: &str) -> ! {
    let path = save(target.name, "", input);
    panic!(
        "fuzz target {name} failed on {which} (AETHER_FUZZ_SEED={seed:#x}): {message}\n\
         input ({len} bytes) written to {path}\n\
         hex: {hex}\n\
         once fixed, add it to the corpus: cp {path} tests/fuzz/corpus/{name}/",
        name = target.name,
        len = input.len(),
        path = path.display(),
        hex = hex(input),
    )
}

/// Aborts the process when one input runs longer than `hang_secs`, after saving it: a hang
/// is a finding too, and the test harness cannot interrupt a running test.
fn watchdog(
    name: &'static str,
    seed: u64,
    hang_secs: u64,
    watch: Arc<Watch>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        let mut since = now();
        while !watch.done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            let execs = watch.execs.load(Ordering::Relaxed);
            if execs != last {
                last = execs;
                since = now();
                continue;
            }
            if since.elapsed() >= Duration::from_secs(hang_secs) {
                let input = watch.current.load_full();
                let path = save(name, "hang-", &input);
                #[allow(clippy::print_stderr)] // The process aborts: stderr is the report.
                {
                    eprintln!(
                        "fuzz target {name}: one input ran for more than {hang_secs} s \
                         (AETHER_FUZZ_SEED={seed:#x}); written to {}\nhex: {}",
                        path.display(),
                        hex(&input)
                    );
                }
                std::process::abort();
            }
        }
    })
}

/// Tokens every format meets: line ends, separators, escapes, numbers at the edges, TLS and
/// DNS header bytes.
const COMMON: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b"\r",
    b"\r\n\r\n",
    b":",
    b"%",
    b"%00",
    b"%2F",
    b"%zz",
    b"\x16\x03",
    b"\x16\x03\x01",
    b"\x00",
    b"\xff",
    b" ",
    b"\t",
    b"/",
    b"?",
    b"=",
    b"&",
    b",",
    b"@",
    b"[",
    b"]",
    b".",
    b"..",
    b"\"",
    b"'",
    b"{",
    b"}",
    b"\\",
    b"\xc3\xa9",
    b"\xef\xbf\xbd",
    b"\xed\xa0\x80",
    b"0",
    b"-1",
    b"65535",
    b"65536",
    b"4294967296",
    b"18446744073709551616",
];

const INTERESTING: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b' ', b'\n', b'\r', b':', b'.', b'/', b'%',
];
const INTERESTING_16: &[u16] = &[
    0, 1, 2, 0x7f, 0x80, 0xff, 0x100, 0x3fff, 0x4000, 0x7fff, 0x8000, 0xffff,
];
const RUN_LENGTHS: &[usize] = &[16, 63, 64, 255, 256, 1024, 4096, 8191, 8192, 8193, 65536];

/// One mutated child of `parent`: 1, 2, 4 or 8 stacked mutations.
pub(crate) fn mutate(
    rng: &mut fastrand::Rng,
    parent: &[u8],
    pool: &[Vec<u8>],
    target: &Target,
) -> Vec<u8> {
    let mut data = parent.to_vec();
    let stack = 1usize << rng.u32(0..4);
    for _ in 0..stack {
        mutate_once(rng, &mut data, pool, target);
    }
    data.truncate(target.max_len);
    data
}

fn token<'a>(rng: &mut fastrand::Rng, target: &'a Target) -> &'a [u8] {
    if !target.dict.is_empty() && rng.u8(..10) < 7 {
        target.dict[rng.usize(..target.dict.len())]
    } else {
        COMMON[rng.usize(..COMMON.len())]
    }
}

fn mutate_once(rng: &mut fastrand::Rng, data: &mut Vec<u8>, pool: &[Vec<u8>], target: &Target) {
    let len = data.len();
    let pos = |rng: &mut fastrand::Rng| rng.usize(..=len);
    let at = |rng: &mut fastrand::Rng| rng.usize(..len.max(1));
    match rng.u8(..16) {
        // A bit flip.
        0 if len > 0 => {
            let i = at(rng);
            data[i] ^= 1 << rng.u32(0..8);
        }
        // A random byte.
        1 if len > 0 => {
            let i = at(rng);
            data[i] = rng.u8(..);
        }
        // An interesting byte.
        2 if len > 0 => {
            let i = at(rng);
            data[i] = INTERESTING[rng.usize(..INTERESTING.len())];
        }
        // Insert a few random bytes.
        3 => {
            let i = pos(rng);
            let n = rng.usize(1..=4);
            let bytes: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            data.splice(i..i, bytes);
        }
        // Delete a range, usually short.
        4 if len > 0 => {
            let i = at(rng);
            let max = if rng.bool() { 16 } else { len };
            let n = rng.usize(1..=max.min(len - i));
            data.drain(i..i + n);
        }
        // Duplicate a range somewhere else.
        5 if len > 0 => {
            let a = at(rng);
            let b = rng.usize(a..=len.min(a + 64));
            let chunk = data[a..b].to_vec();
            let i = pos(rng);
            data.splice(i..i, chunk);
        }
        // Splice: this input's head, another's tail.
        6 if !pool.is_empty() => {
            let other = &pool[rng.usize(..pool.len())];
            let i = pos(rng);
            let j = rng.usize(..=other.len());
            data.truncate(i);
            data.extend_from_slice(&other[j..]);
        }
        // Insert a token.
        7 | 8 => {
            let t = token(rng, target);
            let i = pos(rng);
            data.splice(i..i, t.iter().copied());
        }
        // Overwrite with a token.
        9 if len > 0 => {
            let t = token(rng, target);
            let i = at(rng);
            let end = (i + t.len()).min(len);
            data.splice(i..end, t.iter().copied());
        }
        // A long run of one byte.
        10 => {
            let n = if rng.bool() {
                RUN_LENGTHS[rng.usize(..RUN_LENGTHS.len())]
            } else {
                rng.usize(1..=target.max_len.max(1))
            };
            let n = n.min(target.max_len.saturating_sub(len));
            let b = match rng.u8(..6) {
                0 => b'a',
                1 => b'0',
                2 => 0,
                3 => b'/',
                4 => b'.',
                _ => rng.u8(..),
            };
            let i = pos(rng);
            data.splice(i..i, std::iter::repeat_n(b, n));
        }
        // Add to or subtract from a byte.
        11 if len > 0 => {
            let i = at(rng);
            let d = rng.u8(1..=35);
            data[i] = if rng.bool() {
                data[i].wrapping_add(d)
            } else {
                data[i].wrapping_sub(d)
            };
        }
        // A big-endian u16 (lengths in TLS and DNS).
        12 if len > 1 => {
            let i = rng.usize(..len - 1);
            let v = if rng.bool() {
                INTERESTING_16[rng.usize(..INTERESTING_16.len())]
            } else {
                let cur = u16::from_be_bytes([data[i], data[i + 1]]);
                cur.wrapping_add(rng.u16(0..8)).wrapping_sub(4)
            };
            data[i..i + 2].copy_from_slice(&v.to_be_bytes());
        }
        // Truncate.
        13 if len > 0 => data.truncate(at(rng)),
        // Flip the ASCII case of a byte.
        14 if len > 0 => {
            let i = at(rng);
            data[i] = if data[i].is_ascii_lowercase() {
                data[i].to_ascii_uppercase()
            } else {
                data[i].to_ascii_lowercase()
            };
        }
        // Repeat the whole input.
        15 if len > 0 && len * 2 <= target.max_len => {
            let copy = data.clone();
            data.extend_from_slice(&copy);
        }
        // Every guarded arm whose guard failed: insert a random byte.
        _ => {
            let i = pos(rng);
            data.insert(i, rng.u8(..));
        }
    }
}
