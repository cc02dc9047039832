#!/usr/bin/env bash
# Fails when a file of the pure layer (STYLE.md §6.2, Layer 0) reaches for IO, a clock, tasks or
# globals, or imports a crate outside the Layer-0 allow-list. Run from the repository root.
set -euo pipefail

# Test-only files (tests.rs, proptests.rs) are left out: a test may read PROPTEST_CASES.
pure_files() {
  find src/model src/resolve -name '*.rs' ! -name 'tests.rs' ! -name 'proptests.rs'
  find src -path '*/convert.rs' -o -path 'src/capture/plan.rs' -o -path 'src/proxy/sniff.rs' \
    -o -path 'src/identity/id.rs' -o -path 'src/dns/table.rs' -o -path 'src/dns/resolv.rs' \
    -o -path 'src/lab/plan.rs' -o -path 'src/lab/plan/render.rs' -o -path 'src/marks.rs' | sort -u
}

# Crates a pure file may name in a `use` or a path: std, the crate itself, and the allow-list.
allowed='^(std|core|alloc|crate|self|super|serde|ipnet|http|thiserror|tracing|regex|k8s_openapi|gateway_api|proptest)$'
# Words that mean IO, time, tasks or globals.
banned='(\basync\b|\.await\b|\btokio\b|Instant::now|SystemTime::now|std::fs\b|std::env\b|std::net::(TcpStream|TcpListener|UdpSocket)|thread_rng|std::process|static mut|thread_local!)'

status=0
while IFS= read -r f; do
  [ -f "$f" ] || continue
  # Strip line comments so prose may mention what code may not use.
  code=$(sed -e 's://.*$::' "$f")
  if hits=$(printf '%s\n' "$code" | grep -nE "$banned"); then
    printf 'purity: %s uses IO, a clock, tasks or globals:\n%s\n' "$f" "$hits" >&2
    status=1
  fi
  # The file's own submodules may be named too.
  locals=$(printf '%s\n' "$code" | grep -oE '^\s*(pub(\([a-z]+\))?\s+)?mod\s+[a-z_][a-z0-9_]*' | awk '{print $NF}' | paste -sd'|' -) || true
  # Every `use <crate>::...` must name std, the crate, an allowed crate or a submodule.
  while IFS= read -r krate; do
    if [ -n "$locals" ] && printf '%s' "$krate" | grep -qE "^($locals)$"; then
      continue
    fi
    if ! printf '%s' "$krate" | grep -qE "$allowed"; then
      printf 'purity: %s imports %s, which is outside the Layer-0 allow-list\n' "$f" "$krate" >&2
      status=1
    fi
  done < <(printf '%s\n' "$code" | grep -oE '^\s*(pub(\([a-z]+\))?\s+)?use\s+[a-z_][a-z0-9_]*' | awk '{print $NF}' | sort -u || true)
done < <(pure_files)

# The pure layer must not name the IO layers of this crate.
if grep -rnE 'crate::(registry|proxy|capture|admin|node|app|state)\b' src/model src/resolve >/dev/null; then
  grep -rnE 'crate::(registry|proxy|capture|admin|node|app|state)\b' src/model src/resolve >&2
  echo 'purity: src/model or src/resolve imports an IO layer' >&2
  status=1
fi

if [ "$status" = 0 ]; then
  echo "purity: $(pure_files | wc -l) pure files checked, none reaches for IO"
fi
exit "$status"
