#!/usr/bin/env bash
# Installs the peers that sluice-bench compares sluice with, from the distribution's packages
# (Debian/Ubuntu, apt):
#   nginx (+ the Lua module and lua-resty-core, for the nginx-lua peer), HAProxy, Caddy,
#   wrk and h2load (to check the load generator), iptables (the churn "vanish" variant);
#   with --with-traefik, Traefik built from Go modules.
# Run as root or with sudo. Running it again is harmless.
#
# The packages start system services (nginx, haproxy, caddy) on ports 80/443; sluice-bench
# starts its own instances on free loopback ports, so those services are stopped and disabled
# where systemd manages them.
set -euo pipefail

# --with-traefik: also build Traefik from Go modules (bench/peers/traefik/build.sh; needs Go,
# downloads about 370 MB of modules and compiles for about 10 minutes on one core, so it is
# opt-in; cached afterwards).
with_traefik=0
for arg in "$@"; do
  case "$arg" in
    --with-traefik) with_traefik=1 ;;
    *)
      echo "usage: $0 [--with-traefik]" >&2
      exit 2
      ;;
  esac
done

sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-peers.sh: run as root, or install sudo" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update

# Debian 12 ships nginx-light; later releases fold it into nginx.
nginx_pkg=nginx
if apt-cache show nginx-light >/dev/null 2>&1; then
  nginx_pkg=nginx-light
fi

# Debian has two LuaJIT builds that conflict with each other: libluajit-5.1-2 and libluajit2-5.1-2.
# lua-resty-core (the nginx-lua peer) needs libluajit2-5.1-2; wrk takes either, and when it was
# installed on its own apt gave it libluajit-5.1-2. Swapping that library out from under an
# installed wrk makes dpkg print "dependency problems, but removing anyway ... wrk depends on
# libluajit-5.1-2". So wrk is removed first in that case; the single install below puts it back,
# on libluajit2-5.1-2. (On a machine with neither, that one install picks libluajit2-5.1-2 for
# both and nothing is swapped.)
installed() {
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]
}
if installed wrk && installed libluajit-5.1-2; then
  echo "install-peers.sh: wrk uses libluajit-5.1-2, which lua-resty-core's libluajit2-5.1-2 replaces;" \
    "reinstalling wrk on libluajit2-5.1-2" >&2
  "${sudo_cmd[@]}" apt-get remove -y wrk
fi

packages=(
  "$nginx_pkg"
  libnginx-mod-http-lua
  lua-resty-core
  haproxy
  caddy
  wrk
  nghttp2-client
  iptables
)
"${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${packages[@]}"

if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  for svc in nginx haproxy caddy; do
    if systemctl is-active --quiet "$svc" 2>/dev/null; then
      "${sudo_cmd[@]}" systemctl stop "$svc" || true
      "${sudo_cmd[@]}" systemctl disable "$svc" >/dev/null 2>&1 || true
    fi
  done
fi

status=0
for bin in nginx haproxy caddy wrk h2load iptables; do
  if path="$(PATH="$PATH:/usr/sbin:/sbin" command -v "$bin")"; then
    echo "ok: $bin ($path)"
  else
    echo "missing: $bin" >&2
    status=1
  fi
done
for module in /usr/lib/nginx/modules/ngx_http_lua_module.so /usr/share/lua/5.1/resty/core.lua; do
  if [[ -e "$module" ]]; then
    echo "ok: $module"
  else
    echo "missing: $module (the nginx-lua peer will be skipped)" >&2
  fi
done
if [[ "$with_traefik" == 1 ]]; then
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  if traefik_bin="$("$here/peers/traefik/build.sh")"; then
    echo "ok: traefik ($traefik_bin)"
  else
    echo "failed: traefik (bench/peers/traefik/build.sh)" >&2
    status=1
  fi
fi
exit "$status"
