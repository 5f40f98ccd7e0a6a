//! Kubernetes objects from YAML/JSON files: multi-document parsing with errors that name the
//! file, the document and the field, and a [`ManifestSet`] that keeps each file's last good
//! objects when a new version of it fails to parse.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_config::World;

/// One object sluice reads. (Variants differ in size; a list of them is short-lived.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Object {
    /// networking.k8s.io/v1 Ingress.
    Ingress(Ingress),
    /// networking.k8s.io/v1 IngressClass.
    IngressClass(IngressClass),
    /// v1 Service.
    Service(Service),
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice(EndpointSlice),
    /// v1 Secret.
    Secret(Secret),
}

/// A document that could not be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: document {doc}: {field}: {message}")]
pub struct DocError {
    /// File.
    pub path: String,
    /// 1-based document number in the file.
    pub doc: usize,
    /// Field path (or "-" for syntax errors).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn typed<T: DeserializeOwned>(v: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        (
            if path == "." { "-".to_string() } else { path },
            e.into_inner().to_string(),
        )
    })
}

fn meta_mut(o: &mut Object) -> &mut ObjectMeta {
    match o {
        Object::Ingress(x) => &mut x.metadata,
        Object::IngressClass(x) => &mut x.metadata,
        Object::Service(x) => &mut x.metadata,
        Object::EndpointSlice(x) => &mut x.metadata,
        Object::Secret(x) => &mut x.metadata,
    }
}

/// Converts one document; `Ok(None)` for kinds sluice does not read.
fn object(v: Value) -> Result<Vec<Object>, (String, String)> {
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let api = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut o = match (api.as_str(), kind.as_str()) {
        (_, "List")
        | (_, "IngressList")
        | (_, "ServiceList")
        | (_, "EndpointSliceList")
        | (_, "SecretList") => {
            let items = v
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut out = Vec::new();
            for (i, item) in items.into_iter().enumerate() {
                out.extend(object(item).map_err(|(f, m)| (format!("items[{i}].{f}"), m))?);
            }
            return Ok(out);
        }
        ("networking.k8s.io/v1", "Ingress") => Object::Ingress(typed(v)?),
        ("networking.k8s.io/v1", "IngressClass") => Object::IngressClass(typed(v)?),
        ("v1", "Service") => Object::Service(typed(v)?),
        ("discovery.k8s.io/v1", "EndpointSlice") => Object::EndpointSlice(typed(v)?),
        ("v1", "Secret") => Object::Secret(typed(v)?),
        (_, "Ingress" | "IngressClass" | "Service" | "EndpointSlice" | "Secret") => {
            return Err((
                "apiVersion".into(),
                format!(
                    "{api:?} is not supported for {kind}; use networking.k8s.io/v1 (Ingress, IngressClass), discovery.k8s.io/v1 (EndpointSlice) or v1 (Service, Secret)"
                ),
            ));
        }
        ("", _) | (_, "") => {
            return Err((
                "-".into(),
                "not a Kubernetes object (apiVersion and kind are required)".into(),
            ));
        }
        _ => {
            tracing::debug!(%api, %kind, "skipping a kind sluice does not read");
            return Ok(Vec::new());
        }
    };
    let namespaced = !matches!(o, Object::IngressClass(_));
    let meta = meta_mut(&mut o);
    if meta.name.as_deref().is_none_or(str::is_empty) {
        return Err(("metadata.name".into(), "is required".into()));
    }
    if namespaced && meta.namespace.is_none() {
        meta.namespace = Some("default".into());
    }
    meta.managed_fields = None;
    Ok(vec![o])
}

/// Parses every document of a file. Any bad document fails the whole file, so a half-edited file
/// never replaces its last good version.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Object>, DocError> {
    let err = |doc: usize, field: String, message: String| DocError {
        path: path.display().to_string(),
        doc,
        field,
        message,
    };
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v =
            Value::deserialize(doc).map_err(|e| err(i + 1, "-".into(), format!("YAML: {e}")))?;
        if v.is_null() {
            continue;
        }
        out.extend(object(v).map_err(|(f, m)| err(i + 1, f, m))?);
    }
    Ok(out)
}

fn is_manifest(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Files under the given paths (directories searched recursively, hidden entries skipped).
pub fn discover(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'))
            {
                continue;
            }
            if p.is_dir() {
                walk(&p, out)?;
            } else if is_manifest(&p) {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else {
            // A named file is read whatever its extension; a missing one is an error.
            std::fs::metadata(p)?;
            out.push(p.clone());
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[derive(Debug)]
struct FileState {
    content_hash: u64,
    objects: Vec<Object>,
}

/// What a reload found.
#[derive(Debug, Default)]
pub struct Reload {
    /// Files (re)parsed successfully.
    pub parsed: usize,
    /// Files that failed (their last good objects stay).
    pub errors: Vec<DocError>,
    /// Files that disappeared.
    pub removed: usize,
}

/// The objects of every manifest file, keeping the last good version of each file.
#[derive(Debug, Default)]
pub struct ManifestSet {
    files: BTreeMap<PathBuf, FileState>,
}

impl ManifestSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-reads the files; only files whose content changed are parsed again.
    pub fn reload(&mut self, paths: &[PathBuf]) -> std::io::Result<Reload> {
        let files = discover(paths)?;
        let mut r = Reload::default();
        let mut seen: HashMap<PathBuf, ()> = HashMap::new();
        for f in files {
            seen.insert(f.clone(), ());
            let text = match std::fs::read_to_string(&f) {
                Ok(t) => t,
                Err(e) => {
                    r.errors.push(DocError {
                        path: f.display().to_string(),
                        doc: 0,
                        field: "-".into(),
                        message: format!("cannot read: {e}"),
                    });
                    continue;
                }
            };
            let mut h = DefaultHasher::new();
            text.hash(&mut h);
            let hash = h.finish();
            if self.files.get(&f).is_some_and(|s| s.content_hash == hash) {
                continue;
            }
            match parse(&f, &text) {
                Ok(objects) => {
                    r.parsed += 1;
                    self.files.insert(
                        f,
                        FileState {
                            content_hash: hash,
                            objects,
                        },
                    );
                }
                Err(e) => r.errors.push(e),
            }
        }
        let before = self.files.len();
        self.files.retain(|p, _| seen.contains_key(p));
        r.removed = before - self.files.len();
        Ok(r)
    }

    /// Builds the world from every file's objects (a later file wins a duplicate name).
    pub fn world(&self) -> World {
        let mut w = World::new();
        for state in self.files.values() {
            for o in &state.objects {
                match o.clone() {
                    Object::Ingress(x) => w.put_ingress(x),
                    Object::IngressClass(x) => w.put_ingress_class(x),
                    Object::Service(x) => w.put_service(x),
                    Object::EndpointSlice(x) => {
                        w.put_endpoint_slice(x);
                    }
                    Object::Secret(x) => w.put_secret(x),
                }
            }
        }
        w
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_multi_document_files_and_names_bad_fields() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n---\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n";
        let objs = parse(Path::new("f.yaml"), text).unwrap();
        assert_eq!(objs.len(), 1);
        let Object::Service(s) = &objs[0] else {
            panic!("not a service")
        };
        assert_eq!(s.metadata.namespace.as_deref(), Some("default"));

        let bad = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {ports: [{port: eighty}]}\n";
        let e = parse(Path::new("f.yaml"), bad).unwrap_err();
        assert_eq!(e.doc, 2);
        assert_eq!(e.field, "spec.ports[0].port");
        assert!(
            e.to_string()
                .starts_with("f.yaml: document 2: spec.ports[0].port:"),
            "{e}"
        );

        let syntax = parse(Path::new("f.yaml"), "kind: [unclosed").unwrap_err();
        assert!(syntax.message.starts_with("YAML:"), "{syntax}");
        let noname = parse(
            Path::new("f.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata: {}\n",
        )
        .unwrap_err();
        assert_eq!(noname.field, "metadata.name");
        let oldapi = parse(
            Path::new("f.yaml"),
            "apiVersion: extensions/v1beta1\nkind: Ingress\nmetadata: {name: x}\n",
        )
        .unwrap_err();
        assert_eq!(oldapi.field, "apiVersion");
    }
}
