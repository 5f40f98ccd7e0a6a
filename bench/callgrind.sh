#!/usr/bin/env bash
# Counts the instructions sluice spends per proxied request, under valgrind's callgrind:
# instruction counts repeat from run to run whatever else the machine is doing, which makes
# them the way to compare two builds on a shared, noisy machine (wall-clock rates do not).
#
#   bench/callgrind.sh [OUT] [SLUICE_BIN]
#
# Starts 3 demo backends and `sluice serve --workers 1` on examples/ under callgrind, sends
# 15,000 keep-alive requests (1,500 req/s over 20 connections, Host demo.localhost), stops
# sluice with SIGINT and prints instructions per request for the whole process (start-up,
# which generates the default certificate, excluded) and for the connection tasks.
# Needs valgrind (apt-get install valgrind) and a release build of sluice and sluice-bench.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-bench-out/callgrind.out}"
mkdir -p "$(dirname "$out")"
bin="${2:-target/release/sluice}"
bench=target/release/sluice-bench
requests=15000

for tool in valgrind callgrind_annotate curl; do
  command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool is not installed" >&2; exit 1; }
done
[[ -x "$bin" && -x "$bench" ]] || {
  echo "callgrind.sh: build first: cargo build --release --locked -p sluice -p sluice-bench" >&2
  exit 1
}

"$bench" backends --count 3 --base-port 9001 >/dev/null 2>&1 &
backends=$!
valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" serve --manifests examples/ \
  --workers 1 --http2 false --log-level warn >/dev/null 2>&1 &
proxy=$!
trap 'kill "$backends" 2>/dev/null || true; kill -INT "$proxy" 2>/dev/null || true' EXIT

ready=
for _ in $(seq 120); do
  if curl -s -o /dev/null -H 'Host: demo.localhost' http://127.0.0.1:8080/; then ready=1; break; fi
  sleep 1
done
[[ -n "$ready" ]] || { echo "callgrind.sh: sluice did not come up" >&2; exit 1; }

"$bench" load --url http://demo.localhost:8080/ --connect-to 127.0.0.1:8080 \
  --rate 1500 --connections 20 --duration 10 | grep -E 'requests|non-2xx'
kill -INT "$proxy"
wait "$proxy" || true
kill "$backends" 2>/dev/null || true
trap - EXIT

# The readiness probe above is one more request.
served=$((requests + 1))
annotated="$(mktemp)"
callgrind_annotate --inclusive=yes "$out" >"$annotated" 2>/dev/null
# The first (inclusive) line naming a function; a missing one is reported, not fatal.
first() {
  local n
  n="$( (grep -m1 -F "$1" "$annotated" || true) | awk '{gsub(",", "", $1); print $1}')"
  [[ -n "$n" ]] || echo "callgrind.sh: no line for $1 (renamed?)" >&2
  echo "${n:-0}"
}
total=$(first 'PROGRAM TOTALS')
startup=$(first 'dataplane.rs:sluice_proxy::state::dataplane::DataPlane::new')
conns=$(first 'server/mod.rs:sluice_proxy::server::serve_conn::{{closure}}')
rm -f "$annotated"
echo "instructions per request: whole process $(( (total - ${startup:-0}) / served )), connection tasks $(( ${conns:-0} / served ))  ($out)"
