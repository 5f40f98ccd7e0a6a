#!/usr/bin/env bash
# Builds the Gateway API conformance rig into <repo>/target/gateway-api/:
#
#   kube-controller-manager   upstream kube-controller-manager (k8s.io/kubernetes, cmd/kube-controller-manager)
#   proc-kubelet              the process kubelet (cmd/proc-kubelet)
#   echo-basic                the suite's echo server (sigs.k8s.io/gateway-api/conformance/echo-basic)
#   gwconf.test               the suite (go test -c sigs.k8s.io/gateway-api/conformance)
#   crds/                     the experimental-channel CRDs of sigs.k8s.io/gateway-api
#   base-manifests.yaml       the suite's base manifests (conformance/base/manifests.yaml), for manual runs
#
# and the test kube-apiserver, with tests/kube-apiserver/build.sh (target/kube-apiserver/).
# Everything is pinned by go.mod/go.sum. A stamp (sha256 of go.mod, go.sum, the Go sources, the
# ldflags and `go version`) makes a second run print "up to date" and do nothing.
#
# Environment:
#   GO                        go binary (default: go on PATH, else /usr/local/go/bin/go)
#   GATEWAY_API_BUILD_JOBS    go build -p (default: nproc); also passed to the kube-apiserver build
#   GATEWAY_API_OUT_DIR       output directory (default: <repo>/target/gateway-api)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out_dir="${GATEWAY_API_OUT_DIR:-$repo/target/gateway-api}"
jobs="${GATEWAY_API_BUILD_JOBS:-$(nproc 2>/dev/null || echo 1)}"

GO="${GO:-}"
if [ -z "$GO" ]; then
  if command -v go >/dev/null 2>&1; then
    GO=go
  elif [ -x /usr/local/go/bin/go ]; then
    GO=/usr/local/go/bin/go
  fi
fi
if [ -z "$GO" ] || ! command -v "$GO" >/dev/null 2>&1; then
  echo "build.sh: the Go toolchain (go >= 1.26) is needed, and 'go' was not found on PATH nor at /usr/local/go/bin/go (set GO=/path/to/go)" >&2
  exit 127
fi
export GO

# The API server first: it has its own stamp and lock.
KUBE_APISERVER_BUILD_JOBS="$jobs" "$repo/tests/kube-apiserver/build.sh"

mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
stamp="$out_dir/stamp"

# One build at a time.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$out_dir/.lock"
  flock 9
fi

# The version kube-controller-manager reports: the k8s.io/kubernetes version of go.mod (as the
# API server's build does).
kube_version="$(sed -n 's/^[[:space:]]*k8s\.io\/kubernetes[[:space:]]\{1,\}\(v[0-9][0-9.]*\)\([[:space:]].*\)\{0,1\}$/\1/p' "$here/go.mod" | head -n1)"
if [ -z "$kube_version" ]; then
  echo "build.sh: cannot find the k8s.io/kubernetes version in $here/go.mod" >&2
  exit 1
fi
major="${kube_version#v}"; major="${major%%.*}"
minor="${kube_version#v*.}"; minor="${minor%%.*}"
kcm_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

want="$( {
  cd "$here"
  cat go.mod go.sum
  find cmd -name '*.go' -type f | LC_ALL=C sort | xargs cat
  echo "$kcm_ldflags"
  "$GO" version
} | sha256sum | cut -d' ' -f1)"
outputs=(kube-controller-manager proc-kubelet echo-basic gwconf.test crds base-manifests.yaml)
up_to_date=true
for o in "${outputs[@]}"; do
  [ -e "$out_dir/$o" ] || up_to_date=false
done
if $up_to_date && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "gateway-api rig: up to date ($out_dir)"
  exit 0
fi

rm -f "$stamp"
cd "$here"
export CGO_ENABLED=0
build() { # build NAME ARGS...: one step, timed
  local name="$1" start
  shift
  start=$(date +%s)
  echo "building $name (go -p $jobs)" >&2
  "$GO" "$@"
  echo "built $name in $(( $(date +%s) - start )) s" >&2
}
build kube-controller-manager build -p "$jobs" -trimpath -ldflags "$kcm_ldflags" \
  -o "$out_dir/kube-controller-manager.tmp" ./cmd/kube-controller-manager
build proc-kubelet build -p "$jobs" -trimpath -ldflags "-s -w" -o "$out_dir/proc-kubelet.tmp" ./cmd/proc-kubelet
build echo-basic build -p "$jobs" -trimpath -ldflags "-s -w" -o "$out_dir/echo-basic.tmp" \
  sigs.k8s.io/gateway-api/conformance/echo-basic
build gwconf.test test -c -p "$jobs" -trimpath -o "$out_dir/gwconf.test.tmp" sigs.k8s.io/gateway-api/conformance
for b in kube-controller-manager proc-kubelet echo-basic gwconf.test; do
  mv -f "$out_dir/$b.tmp" "$out_dir/$b"
done

# CRDs and base manifests of exactly the versions in go.mod.
gwapi_dir="$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)"
conf_dir="$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)"
gwapi_version="$("$GO" list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)"
rm -rf "$out_dir/crds"
mkdir -p "$out_dir/crds"
cp "$gwapi_dir"/config/crd/experimental/*.yaml "$out_dir/crds/"
rm -f "$out_dir/crds/kustomization.yaml"
chmod 0644 "$out_dir"/crds/*.yaml
if ! grep -q "gateway.networking.k8s.io/bundle-version: $gwapi_version\$" "$out_dir/crds/gateway.networking.k8s.io_gateways.yaml"; then
  echo "build.sh: the CRDs in $gwapi_dir are not bundle-version $gwapi_version" >&2
  exit 1
fi
install -m 0644 "$conf_dir/base/manifests.yaml" "$out_dir/base-manifests.yaml"

echo "$want" > "$stamp"
echo "gateway-api rig: built ($out_dir; gateway-api $gwapi_version, kubernetes $kube_version)"
