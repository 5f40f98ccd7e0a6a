//! Kubernetes objects from YAML/JSON files: multi-document parsing with errors that name the
//! file, the document and the field, warnings for fields the Kubernetes schema does not have
//! (kubectl warns about them and the API server rejects them under strict field validation),
//! and a [`YamlSet`] that keeps each file's last good objects when a new version of it fails
//! to parse, and remembers what is wrong with each file until the file is fixed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_config::World;
use sluice_config::world::Object;

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

/// The result of parsing one file that parsed.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    /// The objects sluice reads, in file order.
    pub objects: Vec<Object>,
    /// Fields that were ignored because the object's schema has no such field (a typo such as
    /// `spec.portz` would otherwise silently change nothing).
    pub warnings: Vec<DocError>,
}

/// Paths (`spec.rules[0].hots`) of keys present, and not null, in `original` but absent from
/// `round_trip` — the same object deserialized into its Kubernetes type and serialized again.
/// Those are the fields the type does not know.
pub fn unknown_fields(original: &Value, round_trip: &Value) -> Vec<String> {
    fn walk(original: &Value, round_trip: &Value, path: &str, out: &mut Vec<String>) {
        match (original, round_trip) {
            (Value::Object(original), Value::Object(round_trip)) => {
                for (key, value) in original {
                    if value.is_null() {
                        continue;
                    }
                    let child = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    match round_trip.get(key) {
                        Some(other) => walk(value, other, &child, out),
                        None => out.push(child),
                    }
                }
            }
            (Value::Array(original), Value::Array(round_trip)) => {
                for (index, value) in original.iter().enumerate() {
                    let child = format!("{path}[{index}]");
                    match round_trip.get(index) {
                        Some(other) => walk(value, other, &child, out),
                        None => out.push(child),
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(original, round_trip, "", &mut out);
    out
}

/// An object converted from one document, with the paths of the fields its type ignored.
type Converted = (Vec<Object>, Vec<String>);

fn typed<T: DeserializeOwned + Serialize>(v: Value) -> Result<(T, Vec<String>), (String, String)> {
    let t: T = serde_path_to_error::deserialize(&v).map_err(|e| {
        let path = e.path().to_string();
        (
            if path == "." { "-".to_string() } else { path },
            e.into_inner().to_string(),
        )
    })?;
    // `apiVersion` and `kind` were read to choose the type; the Gateway API types (unlike
    // k8s-openapi's) do not write them back, which does not make them unknown.
    let unknown = match serde_json::to_value(&t) {
        Ok(round_trip) => unknown_fields(&v, &round_trip)
            .into_iter()
            .filter(|f| f != "apiVersion" && f != "kind")
            .collect(),
        Err(_) => Vec::new(),
    };
    Ok((t, unknown))
}

/// Converts one document (a `List` into its items); nothing for kinds sluice does not read.
fn object(v: Value) -> Result<Converted, (String, String)> {
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
    match (api.as_str(), kind.as_str()) {
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
            let (mut out, mut unknown) = (Vec::new(), Vec::new());
            for (i, item) in items.into_iter().enumerate() {
                let (objects, fields) =
                    object(item).map_err(|(f, m)| (format!("items[{i}].{f}"), m))?;
                out.extend(objects);
                unknown.extend(fields.into_iter().map(|f| format!("items[{i}].{f}")));
            }
            Ok((out, unknown))
        }
        ("networking.k8s.io/v1", "Ingress") => wrap(typed(v)?, true, Object::Ingress),
        ("networking.k8s.io/v1", "IngressClass") => wrap(typed(v)?, false, Object::IngressClass),
        ("v1", "Service") => wrap(typed(v)?, true, Object::Service),
        ("discovery.k8s.io/v1", "EndpointSlice") => wrap(typed(v)?, true, Object::EndpointSlice),
        ("v1", "Secret") => wrap(typed(v)?, true, Object::Secret),
        ("v1", "ConfigMap") => wrap(typed(v)?, true, Object::ConfigMap),
        ("v1", "Namespace") => wrap(typed::<Namespace>(v)?, false, Object::Namespace),
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "GatewayClass") => {
            wrap(typed(v)?, false, Object::GatewayClass)
        }
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "Gateway") => {
            wrap(typed(v)?, true, Object::Gateway)
        }
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "HTTPRoute") => {
            wrap(typed(v)?, true, Object::HttpRoute)
        }
        ("gateway.networking.k8s.io/v1", "GRPCRoute") => wrap(typed(v)?, true, Object::GrpcRoute),
        ("gateway.networking.k8s.io/v1", "TLSRoute") => wrap(typed(v)?, true, Object::TlsRoute),
        (
            "gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1",
            "ReferenceGrant",
        ) => wrap(typed(v)?, true, Object::ReferenceGrant),
        (
            _,
            "Ingress" | "IngressClass" | "Service" | "EndpointSlice" | "Secret" | "ConfigMap"
            | "Namespace",
        ) => Err((
            "apiVersion".into(),
            format!(
                "{api:?} is not supported for {kind}; use networking.k8s.io/v1 (Ingress, IngressClass), discovery.k8s.io/v1 (EndpointSlice) or v1 (Service, Secret, ConfigMap, Namespace)"
            ),
        )),
        ("", _) | (_, "") => Err((
            "-".into(),
            "not a Kubernetes object (apiVersion and kind are required)".into(),
        )),
        _ => {
            tracing::debug!(%api, %kind, "skipping a kind sluice does not read");
            Ok((Vec::new(), Vec::new()))
        }
    }
}

/// Checks and completes an object's metadata (a name is required; a namespaced object without
/// a namespace is in `default`), then shares it: the file's cache and every world built from
/// it hold the same object, never a copy.
fn wrap<T>(
    (mut t, unknown): (T, Vec<String>),
    namespaced: bool,
    f: fn(Arc<T>) -> Object,
) -> Result<Converted, (String, String)>
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    let meta = t.metadata_mut();
    if meta.name.as_deref().is_none_or(str::is_empty) {
        return Err(("metadata.name".into(), "is required".into()));
    }
    if namespaced && meta.namespace.is_none() {
        meta.namespace = Some("default".into());
    }
    meta.managed_fields = None;
    Ok((vec![f(Arc::new(t))], unknown))
}

/// Parses every document of a file. Any bad document fails the whole file, so a half-edited file
/// never replaces its last good version. Unknown fields do not fail it: they are ignored, as the
/// API server's default (non-strict) field validation does, and returned as warnings.
pub fn parse(path: &Path, text: &str) -> Result<Parsed, DocError> {
    let err = |doc: usize, field: String, message: String| DocError {
        path: path.display().to_string(),
        doc,
        field,
        message,
    };
    let mut out = Parsed::default();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v =
            Value::deserialize(doc).map_err(|e| err(i + 1, "-".into(), format!("YAML: {e}")))?;
        if v.is_null() {
            continue;
        }
        let (objects, unknown) = object(v).map_err(|(f, m)| err(i + 1, f, m))?;
        let what = objects.first().map(Object::describe).unwrap_or_default();
        out.warnings.extend(unknown.into_iter().map(|field| {
            err(
                i + 1,
                field,
                format!(
                    "{what}: unknown field, ignored (kubectl warns about it; the API server rejects it under strict field validation)"
                ),
            )
        }));
        out.objects.extend(objects);
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
    /// Hash of the content last read, good or bad (an unchanged bad file is not parsed again).
    content_hash: u64,
    /// Modification time and length when it was read: a file whose metadata did not change is
    /// not read again (a 10,000-Ingress file costs milliseconds to read and hash).
    stamp: Option<(std::time::SystemTime, u64)>,
    /// The objects of the last version that parsed (none if no version ever did).
    objects: Vec<Object>,
    /// Why the current content was rejected, while it is.
    error: Option<DocError>,
    /// Unknown fields in the current content.
    warnings: Vec<DocError>,
}

/// What a reload found that is new: errors and warnings of the files that changed.
#[derive(Debug, Default)]
pub struct Reload {
    /// Files (re)parsed successfully.
    pub parsed: usize,
    /// Files that failed (their last good objects stay).
    pub errors: Vec<DocError>,
    /// Unknown fields in files that (re)parsed.
    pub warnings: Vec<DocError>,
    /// Files that disappeared.
    pub removed: usize,
    /// Whether every object that changed (before and after, in every changed or removed file)
    /// is an EndpointSlice: then only the pools of [`Reload::touched_services`] need new
    /// endpoints, as the controller's fast path does.
    pub slices_only: bool,
    /// `(namespace, service)` of every EndpointSlice that changed.
    pub touched_services: BTreeSet<(String, String)>,
}

impl Reload {
    /// Notes objects that went away or arrived.
    fn touch(&mut self, objects: &[Object]) {
        for o in objects {
            match o {
                Object::EndpointSlice(s) => {
                    if let Some(svc) = s
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(sluice_config::world::SERVICE_NAME_LABEL))
                    {
                        self.touched_services.insert((
                            s.metadata.namespace.clone().unwrap_or_default(),
                            svc.clone(),
                        ));
                    }
                }
                _ => self.slices_only = false,
            }
        }
    }
}

/// The objects of every manifest file, keeping the last good version of each file.
#[derive(Debug, Default)]
pub struct YamlSet {
    files: BTreeMap<PathBuf, FileState>,
    /// The world of the files' objects, kept up to date as files change.
    kept: super::kept::KeptWorld,
}

/// The stamp to skip a file by next time, or `None` to read it again: an unreadable file
/// (hash 0), and a file modified within the last second — file systems keep modification
/// times in coarse ticks, so a second write of the same length in the same tick would look
/// unchanged ("racy git").
fn trusted(
    stamp: Option<(std::time::SystemTime, u64)>,
    hash: u64,
) -> Option<(std::time::SystemTime, u64)> {
    stamp.filter(|(modified, _)| {
        hash != 0
            && modified
                .elapsed()
                .is_ok_and(|age| age > std::time::Duration::from_secs(1))
    })
}

fn content_hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl YamlSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-reads the files; only files whose content changed are parsed again.
    pub fn reload(&mut self, paths: &[PathBuf]) -> std::io::Result<Reload> {
        let files = discover(paths)?;
        let mut r = Reload {
            slices_only: true,
            ..Reload::default()
        };
        let mut seen: HashMap<PathBuf, ()> = HashMap::new();
        for f in files {
            seen.insert(f.clone(), ());
            let stamp = std::fs::metadata(&f)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())));
            if stamp.is_some() && self.files.get(&f).is_some_and(|s| s.stamp == stamp) {
                continue;
            }
            let (hash, outcome) = match std::fs::read_to_string(&f) {
                Ok(text) => {
                    let hash = content_hash(&text);
                    if let Some(s) = self.files.get_mut(&f)
                        && s.content_hash == hash
                    {
                        s.stamp = trusted(stamp, hash);
                        continue;
                    }
                    (hash, parse(&f, &text))
                }
                // Unreadable: reported, and tried again on the next reload.
                Err(e) => (
                    0,
                    Err(DocError {
                        path: f.display().to_string(),
                        doc: 0,
                        field: "-".into(),
                        message: format!("cannot read: {e}"),
                    }),
                ),
            };
            let state = self.files.entry(f).or_insert_with(|| FileState {
                content_hash: 0,
                stamp: None,
                objects: Vec::new(),
                error: None,
                warnings: Vec::new(),
            });
            state.content_hash = hash;
            state.stamp = trusted(stamp, hash);
            match outcome {
                Ok(parsed) => {
                    r.parsed += 1;
                    r.warnings.extend(parsed.warnings.iter().cloned());
                    r.touch(&state.objects);
                    r.touch(&parsed.objects);
                    self.kept.replace(&state.objects, &parsed.objects);
                    state.objects = parsed.objects;
                    state.warnings = parsed.warnings;
                    state.error = None;
                }
                Err(e) => {
                    r.errors.push(e.clone());
                    state.error = Some(e);
                }
            }
        }
        let before = self.files.len();
        for (_, gone) in self.files.iter().filter(|(p, _)| !seen.contains_key(*p)) {
            r.touch(&gone.objects);
            self.kept.replace(&gone.objects, &[]);
        }
        self.files.retain(|p, _| seen.contains_key(p));
        r.removed = before - self.files.len();
        Ok(r)
    }

    /// Everything wrong with the files as they are now: each rejected file's error and each
    /// unknown field, in file order. Cleared for a file when it is fixed or removed.
    pub fn problems(&self) -> Vec<DocError> {
        self.files
            .values()
            .flat_map(|s| s.error.iter().chain(&s.warnings))
            .cloned()
            .collect()
    }

    /// The part of the world the endpoints fast path reads: the given Services and the
    /// EndpointSlices labelled with them (cloning the whole world costs tens of milliseconds
    /// at 10,000 Ingresses).
    pub fn endpoints_world(&self, services: &BTreeSet<(String, String)>) -> World {
        let mut w = World::new();
        let key = |m: &ObjectMeta| {
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        };
        for o in self.files.values().flat_map(|s| &s.objects) {
            match o {
                Object::Service(x) if services.contains(&key(&x.metadata)) => {
                    w.put(o.clone());
                }
                Object::EndpointSlice(x) => {
                    let svc = x
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(sluice_config::world::SERVICE_NAME_LABEL));
                    let ns = x.metadata.namespace.clone().unwrap_or_default();
                    if svc.is_some_and(|s| services.contains(&(ns, s.clone()))) {
                        w.put(o.clone());
                    }
                }
                _ => {}
            }
        }
        w
    }

    /// The world of every file's objects (a later file wins a duplicate name): kept between
    /// reloads and changed by the files that changed.
    pub fn world(&mut self) -> &World {
        let all = self.files.values().flat_map(|s| &s.objects);
        self.kept.world(all)
    }
}

#[cfg(test)]
mod tests;
