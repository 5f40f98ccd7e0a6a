//! nginx two ways. `nginx-reload`: each change rewrites the upstream block and runs
//! `nginx -s reload` (NGINX OSS Ingress; NGINX Plus Ingress under batched churn).
//! `nginx-lua`: `balancer_by_lua` picks from a per-worker list that a timer re-reads every
//! second from a shared dict, which a local HTTP endpoint fills (community ingress-nginx's way).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{
    BACKLOG, CLIENT_IDLE_S, CONNECT_TIMEOUT_S, HOST, PeerEnv, PeerError, Proc, Proto,
    READ_TIMEOUT_S, State, TRIES, UPSTREAM_KEEPALIVE,
};

const LUA_MODULES: [&str; 2] = [
    "/usr/lib/nginx/modules/ndk_http_module.so",
    "/usr/lib/nginx/modules/ngx_http_lua_module.so",
];
const RESTY_CORE: &str = "/usr/share/lua/5.1/resty/core.lua";

/// A running nginx.
#[derive(Debug)]
pub struct Nginx {
    bin: PathBuf,
    dir: PathBuf,
    conf: Conf,
    /// The Lua endpoint's port (nginx-lua).
    lua_port: Option<u16>,
}

#[derive(Debug, Clone)]
struct Conf {
    port: u16,
    tls: bool,
    http2: bool,
    workers: usize,
    lua_port: Option<u16>,
    /// Runs as a daemon (its master's parent exits): nginx ignores the binary-upgrade signal
    /// (USR2) while the parent it started under is alive, so the upgrade scenario needs it.
    daemon: bool,
    /// `worker_connections` (each worker's share of the clients, plus room for upstreams).
    worker_connections: usize,
}

pub(super) fn unavailable(lua: bool) -> Option<String> {
    if crate::sys::which("nginx").is_none() {
        return Some("nginx not installed (bench/install-peers.sh)".into());
    }
    if lua {
        if let Some(m) = LUA_MODULES.iter().find(|m| !Path::new(m).exists()) {
            return Some(format!(
                "{m} missing (apt-get install libnginx-mod-http-lua)"
            ));
        }
        if !Path::new(RESTY_CORE).exists() {
            return Some(format!(
                "{RESTY_CORE} missing (apt-get install lua-resty-core)"
            ));
        }
    }
    None
}

/// The Lua parts: module loading, the shared dict, the worker timer and the balancer.
fn lua_http(out: &mut String, eps: &[SocketAddr]) {
    let initial = eps
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let _ = write!(
        out,
        r#"  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  lua_shared_dict bench 1m;
  init_by_lua_block {{
    ngx.shared.bench:set("backends", "{initial}")
  }}
  init_worker_by_lua_block {{
    local st = {{ list = {{}}, i = 0, raw = nil }}
    package.loaded.bench_peers = st
    local function sync()
      local v = ngx.shared.bench:get("backends")
      if v == nil or v == st.raw then return end
      local list = {{}}
      for host, port in string.gmatch(v, "([%d%.]+):(%d+)") do
        list[#list + 1] = {{ host, tonumber(port) }}
      end
      st.list, st.raw = list, v
    end
    sync()
    ngx.timer.every(1, function(premature) if not premature then sync() end end)
  }}
"#
    );
}

fn upstream(out: &mut String, eps: &[SocketAddr], lua: bool) {
    out.push_str("  upstream backend {\n");
    if lua {
        out.push_str(
            r#"    server 0.0.0.1;
    balancer_by_lua_block {
      local b = require "ngx.balancer"
      local st = package.loaded.bench_peers
      local n = #st.list
      if n == 0 then return ngx.exit(503) end
      if not ngx.ctx.tried then
        ngx.ctx.tried = true
        b.set_more_tries(2)
      end
      st.i = st.i % n + 1
      local p = st.list[st.i]
      local ok, err = b.set_current_peer(p[1], p[2])
      if not ok then ngx.log(ngx.ERR, err) return ngx.exit(500) end
    }
"#,
        );
    } else {
        for a in eps {
            let _ = writeln!(out, "    server {a};");
        }
        if eps.is_empty() {
            out.push_str("    server 127.0.0.1:1 down;\n");
        }
    }
    let _ = write!(
        out,
        "    keepalive {UPSTREAM_KEEPALIVE};\n    keepalive_requests 1000000;\n    keepalive_timeout 60s;\n  }}\n"
    );
}

fn config(dir: &Path, c: &Conf, eps: &[SocketAddr]) -> String {
    let d = dir.display();
    let mut s = String::new();
    if c.lua_port.is_some() {
        for m in LUA_MODULES {
            let _ = writeln!(s, "load_module {m};");
        }
    }
    let _ = write!(
        s,
        "worker_processes {w};\nworker_rlimit_nofile {nofile};\ndaemon {daemon};\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{\n  worker_connections {wc};\n}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n  keepalive_timeout {CLIENT_IDLE_S}s;\n  keepalive_requests 1000000;\n  proxy_http_version 1.1;\n  proxy_set_header Connection \"\";\n  proxy_set_header Host $host;\n  map $http_x_request_id $req_id {{\n    default $http_x_request_id;\n    \"\" $request_id;\n  }}\n  proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n  proxy_set_header X-Forwarded-Proto $scheme;\n  proxy_set_header X-Forwarded-Host $http_host;\n  proxy_set_header X-Forwarded-Port $server_port;\n  proxy_set_header X-Request-ID $req_id;\n  proxy_connect_timeout {CONNECT_TIMEOUT_S}s;\n  proxy_read_timeout {READ_TIMEOUT_S}s;\n  proxy_send_timeout {READ_TIMEOUT_S}s;\n  proxy_next_upstream error timeout;\n  proxy_next_upstream_tries {TRIES};\n",
        w = c.workers,
        daemon = if c.daemon { "on" } else { "off" },
        wc = c.worker_connections,
        nofile = (c.worker_connections * 2).min(
            usize::try_from(crate::sys::nofile())
                .unwrap_or(usize::MAX)
                .max(16384)
        ),
    );
    if let Some(lp) = c.lua_port {
        lua_http(&mut s, eps);
        let _ = write!(
            s,
            "  server {{\n    listen 127.0.0.1:{lp};\n    location = /configuration/backends {{\n      content_by_lua_block {{\n        ngx.req.read_body()\n        ngx.shared.bench:set(\"backends\", ngx.req.get_body_data() or \"\")\n        ngx.say(\"ok\")\n      }}\n    }}\n  }}\n"
        );
    }
    upstream(&mut s, eps, c.lua_port.is_some());
    // nginx 1.22's spelling (`http2 on;` came in 1.25.1); on TLS, ALPN offers h2 and
    // http/1.1.
    let ssl = match (c.tls, c.http2) {
        (true, true) => " ssl http2",
        (true, false) => " ssl",
        _ => "",
    };
    let _ = write!(
        s,
        "  server {{\n    listen 127.0.0.1:{}{ssl} backlog={BACKLOG};\n    server_name {HOST};\n",
        c.port
    );
    if c.tls {
        let _ = write!(
            s,
            "    ssl_certificate {d}/cert.pem;\n    ssl_certificate_key {d}/key.pem;\n    ssl_protocols TLSv1.2 TLSv1.3;\n    ssl_ciphers ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256;\n    ssl_session_cache shared:SSL:10m;\n"
        );
    }
    s.push_str("    location / {\n      proxy_pass http://backend;\n    }\n  }\n}\n");
    s
}

/// The settings reported for nginx.
pub fn settings(workers: usize, lua: bool) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    s.insert(
        "changes".into(),
        if lua {
            "endpoint list POSTed to a Lua endpoint (shared dict); workers re-read it every 1 s (balancer_by_lua, like ingress-nginx)".into()
        } else {
            "upstream block rewritten + `nginx -s reload` (new workers; old ones close idle keep-alive connections and exit)".into()
        },
    );
    s.insert("retries".into(), format!("proxy_next_upstream error timeout (nginx's default: connect errors and timeouts are retried); proxy_next_upstream_tries {TRIES}"));
    s.insert(
        "balance".into(),
        if lua {
            "round robin in Lua".into()
        } else {
            "round robin (default); max_fails=1 fail_timeout=10s (defaults)".into()
        },
    );
    s.insert(
        "backlog".into(),
        format!("listen ... backlog={BACKLOG} (nginx default 511)"),
    );
    s.insert("workers".into(), format!("worker_processes {workers}"));
    s.insert("timeouts".into(), format!("proxy_connect_timeout {CONNECT_TIMEOUT_S}s, proxy_read_timeout {READ_TIMEOUT_S}s, keepalive_timeout {CLIENT_IDLE_S}s"));
    s.insert(
        "upstream keep-alive".into(),
        format!("keepalive {UPSTREAM_KEEPALIVE}, keepalive_timeout 60s"),
    );
    s.insert(
        "keepalive_requests".into(),
        "1000000 client and upstream (default 1000 would recycle connections mid-run)".into(),
    );
    s.insert("access log".into(), "access_log off".into());
    s.insert(
        "proxy headers".into(),
        "X-Forwarded-For/Proto/Host/Port and X-Request-ID (the client's, else $request_id), as sluice and ingress-nginx send them".into(),
    );
    s.insert(
        "tls".into(),
        "TLSv1.2 TLSv1.3, ssl_session_cache shared:SSL:10m".into(),
    );
    s
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
    lua: bool,
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let bin = crate::sys::which("nginx")
        .ok_or_else(|| PeerError::NotReady("nginx not installed".into()))?;
    open_for_workers(dir).map_err(|e| PeerError::Io("tmp".into(), e))?;
    super::write(&dir.join("cert.pem"), &env.cert.cert_pem)?;
    super::write(&dir.join("key.pem"), &env.cert.key_pem)?;
    let lua_port = if lua { Some(super::free_port()?) } else { None };
    let conf = Conf {
        port,
        tls: env.proto == Proto::Https,
        http2: env.http2,
        workers: env.workers,
        lua_port,
        daemon: env.handover,
        // Any one worker may accept them all.
        worker_connections: env.max_connections.map_or(8192, |n| (n + 1024).max(8192)),
    };
    super::write(&dir.join("nginx.conf"), &config(dir, &conf, eps))?;
    let args = args(dir);
    let mut proc = Proc::spawn(&bin, &args, dir, &[], env.cpus.as_deref())?;
    if conf.daemon {
        // The started process forks the master and exits: follow the master by its pid file.
        let master = wait_pid_file(&dir.join("nginx.pid")).await.ok_or_else(|| {
            PeerError::NotReady(format!("nginx wrote no pid file:\n{}", proc.log_tail()))
        })?;
        proc.wait_exit(std::time::Duration::from_secs(5)).await;
        proc = proc.adopt(master);
    }
    let state = State::Nginx(Nginx {
        bin,
        dir: dir.to_path_buf(),
        conf,
        lua_port,
    });
    let mut s = settings(env.workers, lua);
    if env.http2 {
        s.insert(
            "http2".into(),
            "listen ... ssl http2 (ALPN h2, http/1.1)".into(),
        );
    }
    Ok((Some(proc), state, s))
}

/// The pid in `path` once nginx has written it (up to 10 s).
async fn wait_pid_file(path: &Path) -> Option<u32> {
    let end = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::time::Instant::now() < end {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Some(pid);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

/// Creates `DIR/tmp` and opens both to nginx's workers, which run as `nobody` when the master
/// is root (temporary directories are created 0700): proxied responses larger than the
/// buffers (the 1 MB test) spill into `tmp/proxy`.
pub fn open_for_workers(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))
}

/// `-p DIR -c DIR/nginx.conf -e DIR/error.log`: everything stays in the peer's directory.
pub fn args(dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    vec![
        "-p".into(),
        format!("{d}/"),
        "-c".into(),
        format!("{d}/nginx.conf"),
        "-e".into(),
        format!("{d}/error.log"),
    ]
}

/// Runs `nginx -s reload` for the nginx in `dir` (the signal is sent by a new nginx process
/// that reads the config, as a controller does; it returns before the switch happens).
pub async fn reload(bin: &Path, dir: &Path) -> Result<(), PeerError> {
    let mut a = args(dir);
    a.extend(["-s".into(), "reload".into()]);
    let out = tokio::process::Command::new(bin)
        .args(&a)
        .output()
        .await
        .map_err(|e| PeerError::Change(format!("nginx -s reload: {e}")))?;
    if !out.status.success() {
        return Err(PeerError::Change(format!(
            "nginx -s reload: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Writes an nginx config for `dir` (used by the scale scenario for its own configs).
pub fn write_conf(dir: &Path, content: &str) -> Result<(), PeerError> {
    super::write(&dir.join("nginx.conf"), content)
}

impl Nginx {
    pub(super) async fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        if let Some(lp) = self.lua_port {
            let body = eps
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ");
            let addr = SocketAddr::from(([127, 0, 0, 1], lp));
            return match super::admin_request(addr, "POST", "/configuration/backends", &body).await
            {
                Ok((200, _)) => Ok(()),
                Ok((st, b)) => Err(PeerError::Change(format!("lua endpoint: {st} {b}"))),
                Err(e) => Err(PeerError::Change(e)),
            };
        }
        write_conf(&self.dir, &config(&self.dir, &self.conf, eps))?;
        reload(&self.bin, &self.dir).await
    }
}
