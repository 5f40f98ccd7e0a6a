#!/usr/bin/env bash
# Manual smoke test of the built server with kubectl (not run by CI):
#   tests/kube-apiserver/build.sh && tests/kube-apiserver/smoke.sh [ADDRESS]
# Starts the server on a temp dir, creates the kinds sluice reads, checks that EndpointSlice
# validation rejects a loopback address, checks RBAC for the controller's ServiceAccount before and
# after manifests/base/rbac.yaml, then stops the server with SIGTERM and checks that nothing listens.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${KUBE_APISERVER_BIN:-$here/../../target/kube-apiserver/kube-apiserver}"
manifests="$here/../../manifests/base"
addr="${1:-127.0.0.1}"
command -v kubectl >/dev/null || { echo "smoke.sh: kubectl is needed" >&2; exit 1; }

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
coproc SRV { exec "$bin" --dir "$dir/server" --address "$addr" 2>"$dir/server.log"; }
# shellcheck disable=SC2153 # SRV_PID is set by coproc
srv_pid=$SRV_PID
start=$(date +%s%N)
if ! read -r -t 120 -u "${SRV[0]}" line || [[ "$line" != READY\ * ]]; then
  echo "FAIL: no READY line"; cat "$dir/server.log"; exit 1
fi
echo "$line after $(( ($(date +%s%N) - start) / 1000000 )) ms"
port="${line##*:}"
k() { kubectl --kubeconfig "$dir/server/kubeconfig" "$@"; }
fail() { echo "FAIL: $*"; kill "$srv_pid"; exit 1; }

k version
[ "$(k get --raw /readyz)" = ok ] || fail "/readyz"
k create namespace demo
k -n demo apply -f - <<'Y'
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  ingressClassName: sluice
  rules:
  - host: web.example
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["198.18.0.10"]
  conditions: {ready: true}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: sluice}
spec: {holderIdentity: me, leaseDurationSeconds: 15}
Y
if out="$(k -n demo apply -f - 2>&1 <<'Y'
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-loopback
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["127.0.0.1"]
Y
)"; then fail "a loopback EndpointSlice address was accepted"; fi
echo "loopback EndpointSlice rejected: $out"
k -n demo get ingress,service,endpointslice,lease

k apply -f "$manifests/namespace.yaml" -f "$manifests/serviceaccount.yaml"
sa_token="$(k -n sluice-system create token sluice)"
if out="$(k --token "$sa_token" get ingresses -A 2>&1)"; then fail "RBAC allowed the ServiceAccount before rbac.yaml"; fi
echo "before rbac.yaml: $out"
k apply -f "$manifests/rbac.yaml"
for _ in $(seq 50); do k --token "$sa_token" get ingresses -A >/dev/null 2>&1 && break; sleep 0.1; done
k --token "$sa_token" get ingresses -A
k --token "$sa_token" -n sluice-system create -f - <<'Y'
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: sluice-leader}
spec: {holderIdentity: me}
Y

kill -TERM "$srv_pid"
start=$(date +%s%N)
rc=0; wait "$srv_pid" || rc=$?
echo "exit code $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms after SIGTERM"
[ "$rc" = 0 ] || fail "exit code $rc"
if ss -ltn "sport = :$port" | grep -q LISTEN; then echo "FAIL: port $port still listening"; exit 1; fi
echo "smoke: OK"
