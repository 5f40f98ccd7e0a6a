#!/usr/bin/env bash
# Builds the test kube-apiserver (embedded etcd + k8s.io/kubernetes' kube-apiserver) into
# <repo>/target/kube-apiserver/kube-apiserver. A stamp file holds the sha256 of go.mod, go.sum,
# main.go, the ldflags and the Go version; when it matches, the binary is reused ("up to date").
#
# Environment:
#   GO                           go binary (default: go on PATH, else /usr/local/go/bin/go)
#   KUBE_APISERVER_BUILD_JOBS    go build -p (default: nproc)
#   KUBE_APISERVER_OUT_DIR       output directory (default: <repo>/target/kube-apiserver)
# The first build downloads ~700 MB of Go modules (GOMODCACHE) and compiles for many minutes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${KUBE_APISERVER_OUT_DIR:-$here/../../target/kube-apiserver}"

GO="${GO:-}"
if [ -z "$GO" ]; then
  if command -v go >/dev/null 2>&1; then
    GO=go
  elif [ -x /usr/local/go/bin/go ]; then
    GO=/usr/local/go/bin/go
  fi
fi
if [ -z "$GO" ] || ! command -v "$GO" >/dev/null 2>&1; then
  echo "build.sh: the Go toolchain (go >= 1.26) is needed to build the test kube-apiserver, and 'go' was not found on PATH nor at /usr/local/go/bin/go (set GO=/path/to/go)" >&2
  exit 127
fi

mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
bin="$out_dir/kube-apiserver"
stamp="$out_dir/stamp"

# One build at a time (several test processes may call this script at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$out_dir/.lock"
  flock 9
fi

# The version the server reports: the k8s.io/kubernetes version in go.mod. Without it the server
# reports v0.0.0-master and kubectl cannot parse it.
kube_version="$(sed -n 's/^[[:space:]]*k8s\.io\/kubernetes[[:space:]]\{1,\}\(v[0-9][0-9.]*\)[[:space:]]*$/\1/p' "$here/go.mod" | head -n1)"
if [ -z "$kube_version" ]; then
  echo "build.sh: cannot find the k8s.io/kubernetes version in $here/go.mod" >&2
  exit 1
fi
major="${kube_version#v}"; major="${major%%.*}"
minor="${kube_version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

want="$( { cat "$here/go.mod" "$here/go.sum" "$here/main.go"; echo "$ldflags"; "$GO" version; } | sha256sum | cut -d' ' -f1)"
if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "kube-apiserver $kube_version: up to date ($bin)"
  exit 0
fi

jobs="${KUBE_APISERVER_BUILD_JOBS:-$(nproc 2>/dev/null || echo 1)}"
echo "building kube-apiserver $kube_version into $bin (go build -p $jobs; the first build takes many minutes)" >&2
rm -f "$stamp"
cd "$here"
CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin.tmp" .
mv -f "$bin.tmp" "$bin"
echo "$want" > "$stamp"
echo "kube-apiserver $kube_version: built ($bin)"
