#!/usr/bin/env bash
# Builds Traefik (the version in go.mod's github.com/traefik/traefik/v3 line) from the Go module
# proxy into <repo>/target/traefik/traefik, for sluice-bench's traefik peer. A stamp file holds the
# sha256 of go.mod, go.sum, the ldflags and the Go version; when it matches, the binary is reused
# ("up to date") and the script returns at once.
#
#   bench/peers/traefik/build.sh [--out DIR]
#
# stdout is one line, the binary's path (bin="$(bench/peers/traefik/build.sh)"); progress and the
# time taken go to stderr. The build runs under nice -n 19 and inherits GOMAXPROCS (go build -p
# defaults to it), so GOMAXPROCS=1 leaves the other cores alone.
#
# Environment:
#   GO                   go binary (default: go on PATH, else /usr/local/go/bin/go)
#   TRAEFIK_OUT_DIR      output directory (default: <repo>/target/traefik; --out wins)
#   TRAEFIK_BUILD_JOBS   go build -p (default: go's, i.e. GOMAXPROCS)
# The first build downloads 352 Go modules (370 MB fetched, 2.4 GB unpacked in GOMODCACHE) and
# compiles for about 10 minutes on one core.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${TRAEFIK_OUT_DIR:-$here/../../../target/traefik}"

usage() {
  echo "usage: $0 [--out DIR]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] || usage
      out_dir="$2"
      shift 2
      ;;
    --out=*)
      out_dir="${1#--out=}"
      shift
      ;;
    -h | --help) usage ;;
    *)
      echo "build.sh: unknown argument: $1" >&2
      usage
      ;;
  esac
done

GO="${GO:-}"
if [ -z "$GO" ]; then
  if command -v go >/dev/null 2>&1; then
    GO=go
  elif [ -x /usr/local/go/bin/go ]; then
    GO=/usr/local/go/bin/go
  fi
fi
if [ -z "$GO" ] || ! command -v "$GO" >/dev/null 2>&1; then
  echo "build.sh: the Go toolchain (go >= 1.26) is needed to build traefik, and 'go' was not found on PATH nor at /usr/local/go/bin/go (set GO=/path/to/go)" >&2
  exit 127
fi

mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
bin="$out_dir/traefik"
stamp="$out_dir/stamp"

# One build at a time (several bench processes may call this script at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$out_dir/.lock"
  flock 9
fi

version="$(sed -n 's/^[[:space:]]*require[[:space:]]\{1,\}github\.com\/traefik\/traefik\/v3[[:space:]]\{1,\}\(v[^[:space:]]*\).*$/\1/p; s/^[[:space:]]*github\.com\/traefik\/traefik\/v3[[:space:]]\{1,\}\(v[^[:space:]]*\).*$/\1/p' "$here/go.mod" | head -n1)"
if [ -z "$version" ]; then
  echo "build.sh: cannot find the github.com/traefik/traefik/v3 version in $here/go.mod" >&2
  exit 1
fi
# As Traefik's release build (.goreleaser.yml.tmpl, CODENAME in .github/workflows/release.yaml):
# without these `traefik version` says "dev"/"cheddar". BuildDate is left at its default so the
# build stays reproducible.
pkg=github.com/traefik/traefik/v3/pkg/version
ldflags="-s -w -X $pkg.Version=$version -X $pkg.Codename=ramequin"

want="$( { cat "$here/go.mod" "$here/go.sum"; echo "$ldflags"; "$GO" version; } | sha256sum | cut -d' ' -f1)"
if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "traefik $version: up to date" >&2
  echo "$bin"
  exit 0
fi

jobs=()
if [ -n "${TRAEFIK_BUILD_JOBS:-}" ]; then
  jobs=(-p "$TRAEFIK_BUILD_JOBS")
fi
echo "building traefik $version into $bin (GOMAXPROCS=${GOMAXPROCS:-unset}; the first build takes several minutes)" >&2
rm -f "$stamp"
cd "$here"
start="$(date +%s)"
CGO_ENABLED=0 nice -n 19 "$GO" build "${jobs[@]}" -trimpath -buildvcs=false -ldflags "$ldflags" \
  -o "$bin.tmp" github.com/traefik/traefik/v3/cmd/traefik
mv -f "$bin.tmp" "$bin"
echo "$want" > "$stamp"
echo "traefik $version: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
