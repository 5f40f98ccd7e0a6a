//! The configuration each peer is given in the scale scenario.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use crate::peers::BACKLOG;

pub(super) fn host(i: usize) -> String {
    format!("h{i}.bench.local")
}

pub(super) fn write_file(path: &Path, s: &str) -> std::io::Result<u64> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, s)?;
    std::fs::rename(&tmp, path)?;
    Ok(s.len() as u64)
}

/// What sluice's routes are made of in a scale run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Objects {
    /// One Ingress per host (IngressClass `sluice`).
    Ingress,
    /// One HTTPRoute per host, all attached to one Gateway with a single HTTP listener on the
    /// measured port (sluice only: the other peers read no Gateway API).
    Httproute,
}

impl Objects {
    /// The kind as the API spells it (the report's column).
    pub const fn kind(self) -> &'static str {
        match self {
            Objects::Ingress => "Ingress",
            Objects::Httproute => "HTTPRoute",
        }
    }
}

/// The two Services route changes switch object 0 between, with backends C and D.
pub(super) const SWITCH_SERVICES: [&str; 2] = ["svc-c", "svc-d"];

fn service(name: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n"
    )
}

/// Object `i` (host `i`) sending everything to Service `svc`.
fn route_object(objects: Objects, i: usize, svc: &str) -> String {
    match objects {
        Objects::Ingress => format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: ing-{i}\n  namespace: default\nspec:\n  ingressClassName: sluice\n  rules:\n  - host: \"{}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: {svc}\n            port:\n              number: 80\n",
            host(i)
        ),
        Objects::Httproute => format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: route-{i}\n  namespace: default\nspec:\n  parentRefs: [{{name: bench}}]\n  hostnames: [\"{}\"]\n  rules:\n  - backendRefs: [{{name: {svc}, port: 80}}]\n",
            host(i)
        ),
    }
}

/// The class (and for HTTPRoutes the Gateway, its one listener on `port`) the routes need.
fn route_parents(objects: Objects, port: u16) -> String {
    match objects {
        Objects::Ingress => "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: sluice\nspec:\n  controller: sluice.dev/ingress-controller\n".into(),
        Objects::Httproute => format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: sluice\nspec:\n  controllerName: sluice.dev/gateway-controller\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: bench\n  namespace: default\nspec:\n  gatewayClassName: sluice\n  listeners:\n  - name: http\n    port: {port}\n    protocol: HTTP\n"
        ),
    }
}

/// sluice's manifests: the big files once (objects 1..n, every Service, every slice but service
/// 0's), object 0 in a file of its own (`first.yaml`, rewritten by route changes) and service
/// 0's slice in another (`probe.yaml`, rewritten by endpoint changes). `cd` are backends C and
/// D, behind [`SWITCH_SERVICES`].
pub(super) fn sluice_files(
    dir: &Path,
    objects: Objects,
    (n, port): (usize, u16),
    first: &[SocketAddr],
    ab: &[SocketAddr],
    cd: [SocketAddr; 2],
) -> std::io::Result<u64> {
    use crate::peers::sluice::endpoint_slices;
    let m = dir.join("manifests");
    std::fs::create_dir_all(&m)?;
    let mut total = write_file(&m.join("probe.yaml"), &endpoint_slices("svc-0", first))?;
    if m.join("routes.yaml").exists() {
        return Ok(total);
    }
    let (mut routes, mut svc, mut sl) =
        (route_parents(objects, port), String::new(), String::new());
    for (name, addr) in SWITCH_SERVICES.iter().zip(cd) {
        svc.push_str(&service(name));
        let _ = write!(sl, "---\n{}", endpoint_slices(name, &[addr]));
    }
    for i in 0..n {
        svc.push_str(&service(&format!("svc-{i}")));
        if i > 0 {
            routes.push_str(&route_object(objects, i, &format!("svc-{i}")));
            let _ = write!(sl, "---\n{}", endpoint_slices(&format!("svc-{i}"), ab));
        }
    }
    total += sluice_route_change(dir, objects, "svc-0")?;
    total += write_file(&m.join("routes.yaml"), &routes)?;
    total += write_file(&m.join("services.yaml"), &svc)?;
    total += write_file(&m.join("slices.yaml"), &sl)?;
    Ok(total)
}

/// A route change: object 0 now sends host 0 to Service `svc`.
pub(super) fn sluice_route_change(dir: &Path, objects: Objects, svc: &str) -> std::io::Result<u64> {
    write_file(
        &dir.join("manifests").join("first.yaml"),
        &route_object(objects, 0, svc),
    )
}

pub(super) fn nginx_conf(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
    port: u16,
    workers: usize,
) -> String {
    let d = dir.display();
    let mut s = format!(
        "worker_processes {workers};\nworker_rlimit_nofile 16384;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  server_names_hash_max_size 131072;\n  server_names_hash_bucket_size 128;\n  variables_hash_max_size 2048;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n  proxy_http_version 1.1;\n  proxy_set_header Connection \"\";\n"
    );
    for i in 0..n {
        let eps = if i == 0 { first } else { ab };
        let servers: String = eps.iter().map(|a| format!("server {a}; ")).collect();
        // Listen options may be given once per address.
        let backlog = if i == 0 {
            format!(" backlog={BACKLOG}")
        } else {
            String::new()
        };
        let _ = write!(
            s,
            "  upstream u{i} {{ {servers}keepalive 16; }}\n  server {{ listen 127.0.0.1:{port}{backlog}; server_name {}; location / {{ proxy_pass http://u{i}; }} }}\n",
            host(i)
        );
    }
    s.push_str("}\n");
    s
}

pub(super) fn haproxy_conf(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
    port: u16,
    workers: usize,
) -> (String, String) {
    let d = dir.display();
    let mut s = format!(
        "global\n  nbthread {workers}\n  maxconn 8000\n  hard-stop-after 60s\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 75s\n  timeout server 60s\n  retries 2\n  option redispatch 1\nfrontend fe\n  bind 127.0.0.1:{port}\n  backlog {BACKLOG}\n  use_backend %[req.hdr(host),lower,map({d}/hosts.map,be0)]\n"
    );
    let mut map = String::new();
    for i in 0..n {
        let eps = if i == 0 { first } else { ab };
        let _ = writeln!(map, "{} be{i}", host(i));
        let _ = writeln!(s, "backend be{i}");
        for (k, a) in eps.iter().enumerate() {
            let _ = writeln!(s, "  server s{k} {a}");
        }
    }
    (s, map)
}

/// Traefik's dynamic files: `rest.yml` with every Ingress but the first (written once) and
/// `first.yml` with the first (rewritten on every change); Traefik re-reads the directory.
pub(super) fn traefik_files(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
) -> std::io::Result<u64> {
    use crate::peers::traefik::scale_route;
    let d = dir.join("dynamic");
    std::fs::create_dir_all(&d)?;
    let mut bytes = 0;
    let rest = d.join("rest.yml");
    if n > 1 && !rest.exists() {
        let (mut routers, mut services) = (String::new(), String::new());
        for i in 1..n {
            let (r, s) = scale_route(&format!("r{i}"), &host(i), ab);
            routers.push_str(&r);
            services.push_str(&s);
        }
        bytes += write_file(
            &rest,
            &format!("http:\n  routers:\n{routers}  services:\n{services}"),
        )?;
    }
    let (r, s) = scale_route("r0", &host(0), first);
    bytes += write_file(
        &d.join("first.yml"),
        &format!("http:\n  routers:\n{r}  services:\n{s}"),
    )?;
    Ok(bytes)
}
