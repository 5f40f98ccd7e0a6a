//! The proxy's folders form layers: each top-level module imports only the modules below it in
//! [`LAYERS`], so no module imports another that imports it back, and a newcomer can read the
//! crate from the bottom up. Also: no two files import each other. Test code (`tests` modules
//! and `tests.rs` files) may reach anywhere.
//!
//! The check reads the source: every `crate::a::b` path outside comments and test modules,
//! with `use crate::a::{b, c::d}` groups expanded, resolved to the deepest module that exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the top down; each may import only those after it.
const LAYERS: &[&str] = &[
    "server",
    "handler",
    "admin",
    "state",
    "upstream",
    "telemetry",
    "wire",
    "io",
    "error",
    "clock",
    "crypto",
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

/// Every `crate::` path in `code`, groups expanded.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let base = ident_path(after);
        let tail = &after[base.len()..];
        if let Some(group) = tail.strip_prefix("::{") {
            let close = group.find('}').unwrap_or(group.len());
            for item in group[..close].split(',') {
                let item = ident_path(item.trim());
                if item.is_empty() || item == "self" {
                    out.push(base.to_string());
                } else {
                    out.push(format!("{base}::{item}"));
                }
            }
        } else {
            out.push(base.to_string());
        }
        rest = after;
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

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&root, f)).collect();
    let mut g = BTreeMap::new();
    for f in &files {
        let m = module_of(&root, f);
        if m.last().is_some_and(|l| l == "tests") || m.is_empty() {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(f).unwrap());
        let deps: BTreeSet<Module> = crate_paths(&code)
            .iter()
            .filter_map(|p| resolve(p, &modules))
            .filter(|d| *d != m && !d.is_empty())
            .collect();
        g.insert(m, deps);
    }
    g
}

#[test]
fn every_folder_imports_only_the_layers_below_it() {
    let g = graph();
    let mut wrong = Vec::new();
    for (m, deps) in &g {
        let Some(from) = LAYERS.iter().position(|l| *l == m[0]) else {
            wrong.push(format!("{} is in no layer: add it to LAYERS", m.join("::")));
            continue;
        };
        for d in deps {
            let to = LAYERS.iter().position(|l| *l == d[0]);
            if d[0] != m[0] && to.is_none_or(|to| to <= from) {
                wrong.push(format!("{} imports {}", m.join("::"), d.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_files_import_each_other() {
    let g = graph();
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
            panic!("import cycle: {}", names.join(" → "));
        }
    }
}

#[test]
fn the_scanner_sees_grouped_and_nested_imports() {
    let code = production_code(
        "use crate::a::{b, c::d, self};\nfn f() { crate::x::y(); } // crate::comment\n#[cfg(test)]\nmod tests {\n use crate::z;\n}\n",
    );
    assert_eq!(crate_paths(&code), vec!["a::b", "a::c::d", "a", "x::y"]);
}
