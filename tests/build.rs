//! Finds the external tools some end-to-end tests need and sets a `cfg` for each one that is
//! missing, so those tests are compiled as `#[ignore = "why"]` and show as *ignored* in the
//! default `cargo test` output instead of passing without having checked anything.
//!
//! | cfg | set when | tests |
//! |---|---|---|
//! | `no_kubectl` | `$KUBECTL`, else `kubectl` on `PATH`, does not run | kustomize renders |
//! | `no_helm` | `$HELM`, else `helm` on `PATH` or in `~/go/bin`, does not run | chart renders |
//! | `no_prometheus_parser` | neither `python3` nor `/usr/bin/python3` imports `prometheus_client.openmetrics.parser` (Debian: `python3-prometheus-client`) | `/metrics` parse |
//! | `no_chromium` | none of `chromium`, `chromium-browser`, `google-chrome` on `PATH` runs `--version` | the benchmark report page loaded in a browser |
//! | `no_curl` | `curl --version` does not run | digest authentication with curl as the client |
//! | `no_htpasswd` | `htpasswd` (Debian: apache2-utils) is not on `PATH` | Basic authentication against entries it wrote |
//! | `no_real_apiserver` | not root, no `unshare`/`ip`, or `target/kube-apiserver/kube-apiserver` not built (`tests/kube-apiserver/build.sh`) | the controller suite against a real kube-apiserver |
//!
//! The script runs again when `PATH`, `KUBECTL`, `HELM` or a `PATH` directory changes (a tool was
//! installed or removed), or when the kube-apiserver is (re)built.

use std::path::Path;
use std::process::{Command, Stdio};

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn first_that_runs(env: &str, candidates: Vec<String>, args: &[&str]) -> bool {
    match std::env::var(env) {
        Ok(program) => runs(&program, args),
        Err(_) => candidates.iter().any(|p| runs(p, args)),
    }
}

fn main() {
    for cfg in [
        "no_kubectl",
        "no_helm",
        "no_prometheus_parser",
        "no_real_apiserver",
        "no_chromium",
        "no_curl",
        "no_htpasswd",
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    for env in ["PATH", "KUBECTL", "HELM", "HOME"] {
        println!("cargo::rerun-if-env-changed={env}");
    }
    println!("cargo::rerun-if-changed=build.rs");
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path).filter(|d| d.is_dir()) {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
    }

    if !first_that_runs("KUBECTL", vec!["kubectl".into()], &["version", "--client"]) {
        println!("cargo::rustc-cfg=no_kubectl");
    }
    let mut helms = vec!["helm".to_string()];
    if let Some(home) = std::env::var_os("HOME") {
        let go_bin = Path::new(&home).join("go/bin");
        // `go install` creates go/bin (and go/) on first use: watch the nearest that exists.
        if let Some(dir) = [go_bin.clone(), Path::new(&home).join("go")]
            .into_iter()
            .find(|d| d.is_dir())
        {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        helms.push(go_bin.join("helm").to_string_lossy().into_owned());
    }
    if !first_that_runs("HELM", helms, &["version", "--short"]) {
        println!("cargo::rustc-cfg=no_helm");
    }
    // Debian's python3-prometheus-client lives in the system interpreter, which a pyenv or
    // virtualenv `python3` earlier on PATH does not see.
    let python = ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| runs(p, &["-c", "import prometheus_client.openmetrics.parser"]));
    match python {
        Some(p) => println!("cargo::rustc-env=SLUICE_TEST_PYTHON={p}"),
        None => println!("cargo::rustc-cfg=no_prometheus_parser"),
    }

    if !runs("curl", &["--version"]) {
        println!("cargo::rustc-cfg=no_curl");
    }
    // `htpasswd` has no --version; with -nb it prints an entry and exits 0.
    if !runs("htpasswd", &["-nbB", "probe", "probe"]) {
        println!("cargo::rustc-cfg=no_htpasswd");
    }
    if !["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .any(|b| runs(b, &["--version"]))
    {
        println!("cargo::rustc-cfg=no_chromium");
    }

    // The real kube-apiserver tier: the binary (watched through the directory build.sh writes,
    // which exists once target/ does), root for a network namespace, and the tools that make it.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let server_dir = Path::new(&manifest).join("../target/kube-apiserver");
    let target = Path::new(&manifest).join("../target");
    if let Some(dir) = [server_dir.clone(), target]
        .into_iter()
        .find(|d| d.is_dir())
    {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    let built = server_dir.join("kube-apiserver").is_file() && server_dir.join("stamp").is_file();
    let root = runs("sh", &["-c", "test \"$(id -u)\" = 0"]);
    let netns = runs("unshare", &["--net", "--", "ip", "link", "set", "lo", "up"]);
    if !(built && root && netns) {
        println!("cargo::rustc-cfg=no_real_apiserver");
    }
}
