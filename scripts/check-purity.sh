#!/usr/bin/env bash
# Fails when a file of the pure layer (STYLE.md §6.2, Layer 0) reaches for IO, a clock, tasks,
# globals, randomness or `unsafe`, names a crate outside the Layer-0 allow-list, or names a module
# of this crate that is not pure. Run from anywhere.
#
# The check parses the files with syn (tests/purity.rs and tests/purity/check.rs: the file set,
# the allow-list and the rules live there); a grep could be fooled by grouped imports, aliases and
# paths written without `use` (STYLE.md §9, lesson 1). Each violation prints as `file:line: what`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --locked --quiet --test purity
