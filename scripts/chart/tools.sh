# shellcheck shell=bash
# CHART_TOOLS_MISSING and the other results are read by the scripts that source this.
# shellcheck disable=SC2034
# The chart check's tools, pinned (requirements.txt, package.json and its lock): a Python venv
# and an npm directory in a cache keyed by their pins, made once and reused. Sourced by
# scripts/check-chart and e2e/run.
#
# chart_tools_setup: sets CHART_PY (the venv's python) and CHART_NODE_MODULES; returns 1 with
# CHART_TOOLS_MISSING set to the reason when a tool cannot be had.

chart_tools_dir() {
  local here key
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  key=$(cat "$here/requirements.txt" "$here/package-lock.json" | sha256sum | cut -c1-16)
  echo "${AETHER_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/aether}/chart-tools-$key"
}

# Debian's python3 has no venv module without python3-venv; root installs it.
chart_apt_install() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "$@" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq "$@" >/dev/null; }
}

chart_tools_setup() {
  local here dir
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  dir=$(chart_tools_dir)
  CHART_TOOLS_MISSING=""
  if ! command -v python3 >/dev/null 2>&1; then
    CHART_TOOLS_MISSING="python3 is not installed"
    return 1
  fi
  if [ ! -f "$dir/venv/.complete" ]; then
    echo "setting up the chart tools in $dir (pinned: scripts/chart/requirements.txt)" >&2
    rm -rf "$dir/venv"
    mkdir -p "$dir"
    if ! python3 -m venv "$dir/venv" >/dev/null 2>&1; then
      rm -rf "$dir/venv"
      chart_apt_install python3-venv || true
      if ! python3 -m venv "$dir/venv" >/dev/null 2>&1; then
        CHART_TOOLS_MISSING="python3 -m venv fails (Debian: apt-get install python3-venv)"
        return 1
      fi
    fi
    if ! "$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
      -r "$here/requirements.txt" >&2; then
      CHART_TOOLS_MISSING="pip could not install scripts/chart/requirements.txt"
      return 1
    fi
    touch "$dir/venv/.complete"
  fi
  CHART_PY="$dir/venv/bin/python"
  CHART_BIN="$dir/venv/bin"
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    CHART_TOOLS_MISSING="node and npm are not installed (the Gateway API schemas are an npm package)"
    return 1
  fi
  if [ ! -f "$dir/npm/.complete" ]; then
    rm -rf "$dir/npm"
    mkdir -p "$dir/npm"
    cp "$here/package.json" "$here/package-lock.json" "$dir/npm/"
    if ! (cd "$dir/npm" && npm ci --silent --no-audit --no-fund >&2); then
      CHART_TOOLS_MISSING="npm ci could not install scripts/chart/package.json"
      return 1
    fi
    touch "$dir/npm/.complete"
  fi
  CHART_NODE_MODULES="$dir/npm/node_modules"
  export CHART_PY CHART_BIN CHART_NODE_MODULES
}
