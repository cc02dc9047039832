//! The `aether` binary.

fn main() {}
