//! Model benchmarks (filled by the benchmark work of issue #2).
fn main() {}
