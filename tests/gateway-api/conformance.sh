#!/usr/bin/env bash
# shellcheck disable=SC2317 # stop, rig_pids and cleanup run from the EXIT trap
# Runs the official Gateway API conformance suite (GATEWAY-HTTP and GATEWAY-GRPC profiles;
# GATEWAY_API_PROFILES to choose) against sluice on this
# machine, without a cluster, Docker or images. See README.md. Needs root.
#
#   conformance.sh --report FILE [--run-test NAME] [--sluice PATH]
#   conformance.sh --rig-only
#
# It builds the rig (build.sh), makes the network namespace sluice-gwapi-<pid> (lo with
# 198.18.0.1/24, whose 198.18.0.32/27 is sluice's Gateway address pool; bridge br0 with
# 198.18.1.1/24 for the pods; no default route), and runs in it: the test kube-apiserver, the
# kube-controller-manager, the proc-kubelet, then sluice and the suite. The experimental CRDs and
# the GatewayClass "sluice" are applied first. Everything is stopped and removed on exit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${GATEWAY_API_OUT_DIR:-$repo/target/gateway-api}"
apiserver="$repo/target/kube-apiserver/kube-apiserver"

GATEWAY_POOL=198.18.0.32/27
USABLE_ADDRESS=198.18.0.62
GATEWAY_CLASS=sluice
CONTROLLER_NAME=sluice.dev/gateway-controller
PROFILES="${GATEWAY_API_PROFILES:-GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS}"

usage() {
  cat <<EOF
usage: $0 --report FILE [--run-test NAME] [--sluice PATH]
       $0 --rig-only
  --report FILE    write the conformance report (YAML) to FILE; required unless --rig-only.
                   The rig's logs are copied to FILE.logs/.
  --rig-only       start everything but sluice and the suite, print how to use it, and wait for
                   Ctrl-C (or SIGTERM); then clean up
  --run-test NAME  run only this conformance test (the suite's --run-test)
  --sluice PATH    sluice binary (default: target/release/sluice if present, else target/debug/sluice)
Environment: GATEWAY_API_BUILD_JOBS (go build -p), GATEWAY_API_OUT_DIR (build output).
EOF
}

report="" rig_only=false run_test="" SLUICE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --report) report="${2:?--report needs a file}"; shift 2 ;;
    --rig-only) rig_only=true; shift ;;
    --run-test) run_test="${2:?--run-test needs a test name}"; shift 2 ;;
    --sluice) SLUICE="${2:?--sluice needs a path}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "conformance.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
if ! $rig_only && [ -z "$report" ]; then
  echo "conformance.sh: --report FILE is required (or --rig-only)" >&2
  usage >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "conformance.sh: must run as root (network namespaces, veths, ports 80/443)" >&2
  exit 1
fi
for tool in ip nsenter kubectl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "conformance.sh: '$tool' is needed (kubectl: apt-get install -y kubectl; ip: iproute2; nsenter: util-linux)" >&2
    exit 1
  fi
done
if [ -z "$SLUICE" ]; then
  SLUICE="$repo/target/debug/sluice"
  [ -x "$repo/target/release/sluice" ] && SLUICE="$repo/target/release/sluice"
fi
if ! $rig_only; then
  if [ ! -x "$SLUICE" ]; then
    echo "conformance.sh: no sluice binary at $SLUICE (cargo build, or --sluice PATH)" >&2
    exit 1
  fi
  SLUICE="$(cd "$(dirname "$SLUICE")" && pwd)/$(basename "$SLUICE")"
  mkdir -p "$(dirname "$report")"
  report="$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"
fi

# ======================================================================================
# THE SLUICE COMMAND LINE. Edit here. It runs inside the rig's network namespace, as root;
# $kubeconfig is the admin kubeconfig of the rig's API server (https://198.18.0.1:PORT).
# The Gateway addresses come from $GATEWAY_POOL, which is local (on lo) in that namespace.
# ======================================================================================
sluice_command() {
  SLUICE_CMD=(
    env KUBECONFIG="$kubeconfig"
    "$SLUICE" controller
    --gateway-addresses "$GATEWAY_POOL"
    --admin-listen 127.0.0.1:10254
    # The Ingress listeners default to 0.0.0.0:80 and :443, which takes the Gateways' ports:
    # per-Gateway binds on 198.18.0.x:80/443 then fail with EADDRINUSE and the suite's requests
    # reach the Ingress listener. The suite uses no Ingress: keep them on loopback (sluice
    # refuses to run with both off).
    --http-listen 127.0.0.1:80 --https-listen 127.0.0.1:443
  )
}
# ======================================================================================

log() { printf 'conformance.sh: %s\n' "$*" >&2; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

t0=$(date +%s%N)
GATEWAY_API_BUILD_JOBS="${GATEWAY_API_BUILD_JOBS:-}" "$here/build.sh" >&2
log "build: $(ms_since "$t0") ms"

ns="sluice-gwapi-$$"
tmp="$(mktemp -d /tmp/sluice-gwapi.XXXXXX)"
kubeconfig="$tmp/apiserver/kubeconfig"
apiserver_pid="" kcm_pid="" kubelet_pid="" sluice_pid="" suite_pid="" tail_pid=""

# Processes started in the background are started with a plain `ip netns exec` (which execs
# the program), never through a function: $! must be the program's own pid, not a subshell's.
in_ns() { ip netns exec "$ns" "$@"; }
k() { in_ns kubectl --kubeconfig "$kubeconfig" "$@"; }

# stop PID SECONDS: SIGTERM, then SIGKILL if it is still there after SECONDS.
stop() {
  local pid="$1" secs="$2" i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# rig_pids: every process of this rig that is still alive: those in the namespace, and the pod
# processes (each in a namespace of its own), which carry PROC_KUBELET_RIG=<namespace name>.
rig_pids() {
  local f
  ip netns pids "$ns" 2>/dev/null || true
  for f in /proc/[0-9]*/environ; do
    if grep -qxzF "PROC_KUBELET_RIG=$ns" "$f" 2>/dev/null; then
      f="${f#/proc/}"
      echo "${f%/environ}"
    fi
  done
}

cleanup() {
  local rc=$? pids
  trap - EXIT INT TERM
  set +e
  log "cleaning up (exit code $rc)"
  stop "$suite_pid" 5
  stop "$sluice_pid" 10
  stop "$kubelet_pid" 10 # it kills its pods
  stop "$kcm_pid" 5
  if [ -n "$apiserver_pid" ]; then
    exec {apiserver_in}>&- 2>/dev/null # EOF on its stdin: it shuts down
    stop "$apiserver_pid" 15
  fi
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
  # Whatever is left, by namespace and by marker.
  pids="$(rig_pids | sort -un | tr '\n' ' ')"
  if [ -n "${pids// /}" ]; then
    log "killing leftover processes: $pids"
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null
    sleep 0.5
  fi
  if ip netns list | grep -qw "$ns"; then
    ip netns del "$ns" || log "could not delete network namespace $ns"
  fi
  if [ -n "$report" ] && [ -d "$tmp" ]; then
    mkdir -p "$report.logs"
    cp "$tmp"/*.log "$report.logs/" 2>/dev/null
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- network namespace ---------------------------------------------------------------
ip netns add "$ns"
in_ns ip link set lo up
in_ns ip addr add 198.18.0.1/24 dev lo
in_ns ip link add br0 type bridge
in_ns ip addr add 198.18.1.1/24 dev br0
in_ns ip link set br0 up
log "network namespace $ns: lo 198.18.0.1/24 (Gateway pool $GATEWAY_POOL), br0 198.18.1.1/24, no default route"

# --- kube-apiserver (stdin kept open: it stops when this script goes) ------------------
t1=$(date +%s%N)
coproc APISERVER { exec ip netns exec "$ns" "$apiserver" --dir "$tmp/apiserver" --address 198.18.0.1 2>"$tmp/kube-apiserver.log"; }
# shellcheck disable=SC2153 # APISERVER_PID is set by coproc
apiserver_pid=$APISERVER_PID
apiserver_in=${APISERVER[1]}
line=""
if ! read -r -t 180 -u "${APISERVER[0]}" line || [[ "$line" != READY\ * ]]; then
  log "kube-apiserver did not get ready; its log:"
  tail -n 30 "$tmp/kube-apiserver.log" >&2
  exit 1
fi
log "kube-apiserver: $line after $(ms_since "$t1") ms"

# --- kube-controller-manager -----------------------------------------------------------
ip netns exec "$ns" "$out/kube-controller-manager" \
  --kubeconfig "$kubeconfig" \
  --controllers=deployment-controller,replicaset-controller,endpointslice-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller \
  --leader-elect=false --use-service-account-credentials=false \
  --secure-port=0 --v=1 \
  >"$tmp/kube-controller-manager.log" 2>&1 &
kcm_pid=$!

# --- proc-kubelet ------------------------------------------------------------------------
ip netns exec "$ns" "$out/proc-kubelet" \
  --kubeconfig "$kubeconfig" --node-name proc-node --node-ip 127.0.0.1 --listen 127.0.0.1:10250 \
  --state-dir "$tmp/kubelet" --echo-basic "$out/echo-basic" \
  --bridge br0 --pod-cidr 198.18.1.0/24 --pod-gateway 198.18.1.1 --rig-id "$ns" \
  >"$tmp/proc-kubelet.log" 2>&1 &
kubelet_pid=$!

# --- CRDs and GatewayClass -----------------------------------------------------------------
t2=$(date +%s%N)
crds=()
for f in "$out"/crds/*.yaml; do
  case "$f" in *_vap_*) ;; *) crds+=(-f "$f") ;; esac
done
k apply --server-side "${crds[@]}" >/dev/null
for f in "$out"/crds/*_vap_*.yaml; do
  [ -e "$f" ] || continue
  k apply --server-side -f "$f" >/dev/null 2>&1 || log "skipped $(basename "$f") (the API server refused it)"
done
k wait --for condition=established --timeout=60s crd --all >/dev/null
k apply --server-side -f - >/dev/null <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: $GATEWAY_CLASS
spec:
  controllerName: $CONTROLLER_NAME
EOF
log "CRDs and GatewayClass $GATEWAY_CLASS ($CONTROLLER_NAME) applied in $(ms_since "$t2") ms"

# The controller-manager works once it has made the default ServiceAccount; the node exists
# once proc-kubelet has registered.
for ((i = 0; ; i++)); do
  if k get serviceaccount default >/dev/null 2>&1 && k get node proc-node >/dev/null 2>&1; then break; fi
  for p in "$kcm_pid" "$kubelet_pid"; do
    if ! kill -0 "$p" 2>/dev/null; then
      log "a rig process exited; last lines of its logs:"
      tail -n 20 "$tmp/kube-controller-manager.log" "$tmp/proc-kubelet.log" >&2
      exit 1
    fi
  done
  if [ "$i" -ge 600 ]; then
    log "kube-controller-manager or proc-kubelet not working after 60 s"
    exit 1
  fi
  sleep 0.1
done
log "rig ready $(ms_since "$t0") ms after start ($(ms_since "$t1") ms after starting the API server)"

if $rig_only; then
  cat <<EOF

The rig is running. Ctrl-C (or SIGTERM to $$) stops and removes it.
  network namespace: $ns       enter it:  ip netns exec $ns bash
  kubeconfig:        $kubeconfig
                     (inside the namespace: export KUBECONFIG=$kubeconfig)
  the suite's base manifests:  kubectl apply -f $out/base-manifests.yaml
  logs:              $tmp/*.log
  Gateway pool:      $GATEWAY_POOL (local on lo); pods on br0 198.18.1.0/24
  sluice would run as: ip netns exec $ns $(sluice_command; printf '%q ' "${SLUICE_CMD[@]}")

EOF
  while true; do
    for p in "$apiserver_pid" "$kcm_pid" "$kubelet_pid"; do
      if ! kill -0 "$p" 2>/dev/null; then
        log "a rig process ($p) exited; the end of the logs:"
        tail -n 15 "$tmp"/*.log >&2
        exit 1
      fi
    done
    sleep 2 &
    wait $! || true
  done
fi

# --- sluice ---------------------------------------------------------------------------------
sluice_command
log "starting sluice: ${SLUICE_CMD[*]}"
ip netns exec "$ns" "${SLUICE_CMD[@]}" >"$tmp/sluice.log" 2>&1 &
sluice_pid=$!
sleep 1
if ! kill -0 "$sluice_pid" 2>/dev/null; then
  rc=0
  wait "$sluice_pid" || rc=$?
  log "!!! sluice exited at once (exit code $rc); the suite will wait for the GatewayClass in vain. Its output:"
  tail -n 20 "$tmp/sluice.log" >&2
  sluice_pid=""
fi

# --- the suite ---------------------------------------------------------------------------------
features="$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/features.txt" | grep -v '^$' | paste -sd, -)"
version="$(git -C "$repo" describe --tags --dirty 2>/dev/null || echo 0.1.0)"
suite_args=(
  -test.run '^TestConformance$' -test.v -test.timeout 90m
  --kubeconfig "$kubeconfig"
  --gateway-class "$GATEWAY_CLASS"
  --conformance-profiles "$PROFILES"
  --supported-features "$features"
  --cleanup-base-resources=false
  --report-output "$report"
  # GatewayStaticAddresses: an address of the pool no other Gateway takes first (the pool, 32 addresses so that the Gateways three profiles leave behind never reach it, is
  # handed out from its start), and one of TEST-NET-3, which is never local.
  --usable-address "$USABLE_ADDRESS" --unusable-address 203.0.113.9
  --organization sluice --project sluice --url https://github.com/sluice-dev/sluice
  --version "$version" --contact sluice
)
[ -n "$run_test" ] && suite_args+=(--run-test "$run_test")
rm -f "$report"
log "running the suite: gwconf.test ${suite_args[*]}"
t3=$(date +%s%N)
(cd "$tmp" && exec ip netns exec "$ns" "$out/gwconf.test" "${suite_args[@]}") >"$tmp/suite.log" 2>&1 &
suite_pid=$!
tail -n +1 -f --pid="$suite_pid" "$tmp/suite.log" &
tail_pid=$!
suite_rc=0
wait "$suite_pid" || suite_rc=$?
suite_pid=""
wait "$tail_pid" 2>/dev/null || true
tail_pid=""
log "suite finished in $(( $(ms_since "$t3") / 1000 )) s, exit code $suite_rc"

if [ -s "$report" ]; then
  echo
  echo "=== report summary ($report) ==="
  # The profiles, without the long feature lists (counted instead).
  awk '
    /^profiles:/ { on = 1 }
    !on { next }
    skip && $0 ~ "^" ind " *- " { n++; next }
    skip { printf "%s%s: %d\n", ind, key, n; skip = 0 }
    /^ *(un)?supportedFeatures:/ { match($0, /^ */); ind = substr($0, 1, RLENGTH); key = $1; sub(/:$/, "", key); n = 0; skip = 1; next }
    { print }
    END { if (skip) printf "%s%s: %d\n", ind, key, n }
  ' "$report"
else
  echo
  echo "=== no report was written; the end of the suite's output: ==="
  tail -n 15 "$tmp/suite.log"
fi
exit "$suite_rc"
