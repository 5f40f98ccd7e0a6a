//! The proxy's and the config crate's folders form layers: each top-level module imports only
//! the modules below it in its crate's list ([`PROXY`], [`CONFIG`]), so no module imports
//! another that imports it back, and a newcomer can read a crate from the bottom up. Also: no
//! two files import each other. Test code (`tests` modules and `tests*.rs` files) may reach
//! anywhere. And the proxy reads only the config crate's model, never its annotation parsers or
//! its translation.
//!
//! The check reads the source: every `crate::a::b` and `super::a` path outside comments and
//! test modules, with `use crate::a::{b, c::d}` groups expanded, resolved to the deepest module
//! that exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The proxy's top-level modules from the top down; each may import only those after it.
const PROXY: &[&str] = &[
    "server",
    "handler",
    "admin",
    "state",
    "policy",
    "upstream",
    "telemetry",
    "wire",
    "io",
    "error",
    "clock",
    "crypto",
];

/// The config crate's top-level modules from the top down: the Ingress → Gateway API
/// converter (it reads annotations the way translation does) over translation, over the
/// annotation
/// readers and the ConfigMap, over the snapshot and its matcher, over the model (routes and
/// settings, then the route edits as data), over the pure leaves (hosts, paths, PEM, htpasswd,
/// the names of objects and pools, CIDRs) and the world of objects.
const CONFIG: &[&str] = &[
    "convert",
    "translate",
    "gateway",
    "configmap",
    "annotations",
    "resolve",
    "snapshot",
    "gateway_model",
    "matcher",
    "model",
    "route_policy",
    "world",
    "gateway_api",
    "host",
    "path",
    "request_path",
    "pem",
    "htpasswd",
    "refs",
    "cidr",
    "merge",
];

/// The config crate's modules the proxy may not read: everything above the snapshot, and the
/// world of Kubernetes objects. It reads the model and the pure leaves.
const CONFIG_NOT_FOR_PROXY: &[&str] = &[
    "convert",
    "translate",
    "gateway",
    "configmap",
    "annotations",
    "resolve",
    "world",
    "gateway_api",
];

type Module = Vec<String>;

fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without line comments and without a trailing `#[cfg(test)] mod tests`.
fn production_code(src: &str) -> String {
    let mut out = String::new();
    let mut pending_cfg_test = false;
    for line in src.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test {
            if t.starts_with("#[") {
                continue;
            }
            if t.contains("mod tests") && t.ends_with('{') {
                break;
            }
            pending_cfg_test = false;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn ident_path(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end].trim_end_matches(':')
}

/// Every path in `code` that starts with `prefix` (`crate::`, `super::`, `sluice_config::`),
/// groups expanded, without the prefix.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(prefix).map(|i| i + from) {
        // `foo_crate::` is not `crate::`, nor is the inner `super::` of `super::super::`: the
        // prefix must start a path.
        let before = code[..i].chars().next_back();
        let after = &code[i + prefix.len()..];
        from = i + prefix.len();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let base = ident_path(after);
        let tail = &after[base.len()..];
        let group = if base.is_empty() {
            tail.strip_prefix('{')
        } else {
            tail.strip_prefix("::{")
        };
        if let Some(group) = group {
            let close = group.find('}').unwrap_or(group.len());
            for item in group[..close].split(',') {
                let item = ident_path(item.trim());
                match (base.is_empty(), item.is_empty() || item == "self") {
                    (_, true) => out.push(base.to_string()),
                    (true, false) => out.push(item.to_string()),
                    (false, false) => out.push(format!("{base}::{item}")),
                }
            }
        } else {
            out.push(base.to_string());
        }
    }
    out
}

/// Every `crate::` path in `code`, groups expanded.
fn crate_paths(code: &str) -> Vec<String> {
    paths_after(code, "crate::")
}

/// Every module path `code` (the file of module `m`) names, as paths from the crate root:
/// its `crate::` paths and its `super::` ones (`super::super::` climbs twice). A parent's
/// paths into its own children (`catalog::lookup` in `annotations/mod.rs`) are not counted: a
/// folder's `mod.rs` and its files are one room.
fn module_paths(code: &str, m: &Module) -> Vec<String> {
    let mut out = crate_paths(code);
    for p in paths_after(code, "super::") {
        let mut up = 1;
        let mut rest = p.as_str();
        while let Some(r) = rest.strip_prefix("super::") {
            up += 1;
            rest = r;
        }
        if rest == "super" {
            up += 1;
            rest = "";
        }
        let Some(keep) = m.len().checked_sub(up) else {
            continue;
        };
        let mut full: Vec<&str> = m[..keep].iter().map(String::as_str).collect();
        full.extend(rest.split("::").filter(|s| !s.is_empty()));
        out.push(full.join("::"));
    }
    out
}

fn resolve(path: &str, modules: &BTreeSet<Module>) -> Option<Module> {
    let parts: Module = path.split("::").map(str::to_string).collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].to_vec())
        .find(|m| modules.contains(m))
}

/// A crate's source folder.
fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

/// Whether a module is test code.
fn is_test(m: &Module) -> bool {
    m.iter().any(|p| p.starts_with("tests"))
}

fn graph(krate: &str) -> BTreeMap<Module, BTreeSet<Module>> {
    let root = src(krate);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&root, f)).collect();
    let mut g = BTreeMap::new();
    for f in &files {
        let m = module_of(&root, f);
        if is_test(&m) || m.is_empty() {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(f).unwrap());
        let deps: BTreeSet<Module> = module_paths(&code, &m)
            .iter()
            .filter_map(|p| resolve(p, &modules))
            .filter(|d| *d != m && !d.is_empty())
            .collect();
        g.insert(m, deps);
    }
    g
}

fn check_layers(krate: &str, layers: &[&str]) {
    let g = graph(krate);
    let mut wrong = Vec::new();
    for (m, deps) in &g {
        let Some(from) = layers.iter().position(|l| *l == m[0]) else {
            wrong.push(format!(
                "{} is in no layer: add it to the list",
                m.join("::")
            ));
            continue;
        };
        for d in deps {
            let to = layers.iter().position(|l| *l == d[0]);
            if d[0] != m[0] && to.is_none_or(|to| to <= from) {
                wrong.push(format!("{} imports {}", m.join("::"), d.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{krate}: layering broken:\n{}",
        wrong.join("\n")
    );
}

fn check_no_cycle(krate: &str) {
    let g = graph(krate);
    // Depth-first search for a cycle among files.
    fn visit(
        m: &Module,
        g: &BTreeMap<Module, BTreeSet<Module>>,
        state: &mut BTreeMap<Module, u8>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match state.get(m) {
            Some(1) => {
                let at = stack.iter().position(|s| s == m).unwrap_or(0);
                return Some(stack[at..].to_vec());
            }
            Some(_) => return None,
            None => {}
        }
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, g, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if let Some(cycle) = visit(m, &g, &mut state, &mut Vec::new()) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!("{krate}: import cycle: {}", names.join(" → "));
        }
    }
}

#[test]
fn every_proxy_folder_imports_only_the_layers_below_it() {
    check_layers("proxy", PROXY);
}

#[test]
fn every_config_folder_imports_only_the_layers_below_it() {
    check_layers("config", CONFIG);
}

#[test]
fn no_two_files_import_each_other() {
    check_no_cycle("proxy");
    check_no_cycle("config");
}

#[test]
fn the_proxy_reads_only_the_config_model() {
    let root = src("proxy");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let config_modules: BTreeSet<String> = {
        let mut f = Vec::new();
        rust_files(&src("config"), &mut f);
        f.iter()
            .filter_map(|p| module_of(&src("config"), p).first().cloned())
            .collect()
    };
    let mut wrong = Vec::new();
    for f in &files {
        if is_test(&module_of(&root, f)) {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(f).unwrap());
        for p in paths_after(&code, "sluice_config::") {
            let first = p.split("::").next().unwrap_or("");
            // A root re-export (`sluice_config::Snapshot`) is the model's; a module must be
            // one the proxy may read.
            if config_modules.contains(first) && CONFIG_NOT_FOR_PROXY.contains(&first) {
                wrong.push(format!("{}: sluice_config::{p}", f.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the proxy reaches past the config model:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scanner_sees_grouped_nested_and_relative_imports() {
    let code = production_code(
        "use crate::a::{b, c::d, self};\nfn f() { crate::x::y(); } // crate::comment\n#[cfg(test)]\nmod tests {\n use crate::z;\n}\n",
    );
    assert_eq!(crate_paths(&code), vec!["a::b", "a::c::d", "a", "x::y"]);
    let m: Module = vec!["annotations".into(), "auth".into()];
    let code =
        "use super::{first, traffic::flag};\nuse super::super::model::X;\nuse sluice_crate::y;";
    assert_eq!(
        module_paths(code, &m),
        vec![
            "annotations::first",
            "annotations::traffic::flag",
            "model::X"
        ]
    );
}
