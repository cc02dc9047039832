//! `aether node`: the daemon, on its runtime.

use std::process::ExitCode;

use anyhow::Context;

/// Install the log subscriber; the handle changes its filter at run time (`aether debug
/// log-level`).
pub(crate) fn init_logs(
    format: aether::node::config::LogFormat,
    level: &str,
) -> aether::log_filter::LogFilter {
    aether::log_filter::init(format, level)
}

pub(crate) fn run_node(args: &aether::node::config::NodeArgs) -> anyhow::Result<ExitCode> {
    let config = args.load()?;
    let logs = init_logs(config.log_format, &config.log_level);
    release_freed_memory_in_background();
    let runtime = node_runtime(config.worker_threads).context("start the runtime")?;
    runtime.block_on(aether::node::run_with_logs(config, logs))?;
    Ok(ExitCode::SUCCESS)
}

/// The daemon's runtime: one thread runs everything with `workers == 1` (no work stealing, so
/// no worker is woken to look for work another already holds: docs/performance.md), else a
/// work-stealing pool of `workers`.
pub(crate) fn node_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
}

/// With jemalloc (the default build), start its background thread, which returns freed memory to
/// the system on a timer (jemalloc's decay, 10 s): without it, memory freed after a flood of
/// connections goes back only when later allocations happen to trigger the purge, and an idle
/// daemon keeps its peak (docs/performance.md, "Memory").
pub(crate) fn release_freed_memory_in_background() {
    #[cfg(feature = "jemalloc")]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc's background thread did not start: freed memory returns to the system only as later allocations purge it");
    }
}
