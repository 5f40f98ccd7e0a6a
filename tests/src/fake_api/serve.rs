//! The fake's answers: routing a request to list, get, watch, create, patch or delete, and
//! the selectors, paths and merge patches they need.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::{Ev, FakeApi, KINDS, Logged};

fn status(code: u16, reason: &str, message: &str) -> Response<BoxBody<Bytes, Infallible>> {
    let v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn ok_json(code: u16, v: &Value) -> Response<BoxBody<Bytes, Infallible>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(&b[i + 1..(i + 3).min(b.len())])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map_or((decode(kv), String::new()), |(k, v)| (decode(k), decode(v)))
        })
        .collect()
}

/// Label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated.
fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels[k.trim()].as_str() != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                labels[k.trim()].as_str() == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                labels.get(k.trim()).is_none()
            } else {
                labels.get(term).is_some()
            }
        })
}

/// Field selector: `path=value` / `path!=value` on dotted paths (`type`, `metadata.name`).
fn fields_match(obj: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            let (path, want, neg) = match term.split_once("!=") {
                Some((p, v)) => (p, v, true),
                None => match term.split_once("==").or_else(|| term.split_once('=')) {
                    Some((p, v)) => (p, v, false),
                    None => return true,
                },
            };
            let got = path
                .split('.')
                .fold(obj, |v, k| &v[k])
                .as_str()
                .unwrap_or("");
            (got == want) != neg
        })
}

struct Target {
    kind: usize,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    for (i, k) in KINDS.iter().enumerate() {
        let Some(rest) = path.strip_prefix(k.prefix) else {
            continue;
        };
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        let (ns, rest) = match parts.as_slice() {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => {
                (Some(ns.to_string()), rest.to_vec())
            }
            rest => (None, rest.to_vec()),
        };
        if rest.first() != Some(&k.plural) {
            continue;
        }
        return Some(Target {
            kind: i,
            ns,
            name: rest.get(1).map(|s| s.to_string()),
            sub: rest.get(2).map(|s| s.to_string()),
        });
    }
    None
}

fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

impl FakeApi {
    pub(super) async fn handle(
        &self,
        req: Request<Incoming>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let q = query(parts.uri.query().unwrap_or(""));
        self.lock().requests.push(Logged {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        if self.lock().fail_all {
            return status(
                500,
                "InternalError",
                "the API server is down (injected by the test)",
            );
        }
        let Some(t) = parse_path(parts.uri.path()) else {
            return status(404, "NotFound", "no such resource type");
        };
        let k = KINDS[t.kind];
        let ct = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        match (parts.method, t.name.as_deref(), t.sub.as_deref()) {
            (Method::GET, None, None)
                if q.get("watch").is_some_and(|w| w == "true" || w == "1") =>
            {
                self.watch(&t, &q)
            }
            (Method::GET, None, None) => {
                let st = self.lock();
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|((ki, ns, _), _)| {
                        *ki == t.kind && t.ns.as_ref().is_none_or(|n| n == ns)
                    })
                    .map(|(_, v)| v)
                    .filter(|v| {
                        q.get("labelSelector").is_none_or(|s| labels_match(v, s))
                            && q.get("fieldSelector").is_none_or(|s| fields_match(v, s))
                    })
                    .cloned()
                    .collect();
                ok_json(
                    200,
                    &json!({"kind": format!("{}List", k.kind), "apiVersion": k.api_version, "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                )
            }
            (Method::GET, Some(name), None) => {
                let st = self.lock();
                match st
                    .objects
                    .get(&(t.kind, t.ns.clone().unwrap_or_default(), name.to_string()))
                {
                    Some(v) => ok_json(200, v),
                    None => status(404, "NotFound", &format!("{} {name:?} not found", k.plural)),
                }
            }
            (Method::POST, None, None) => {
                let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "invalid JSON");
                };
                if let Some(ns) = &t.ns {
                    obj["metadata"]["namespace"] = json!(ns);
                }
                if obj["metadata"]["name"].is_null()
                    && let Some(prefix) = obj["metadata"]["generateName"].as_str()
                {
                    obj["metadata"]["name"] = json!(format!("{prefix}{}", fastrand::u32(..)));
                }
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let mut st = self.lock();
                if st.objects.contains_key(&(
                    t.kind,
                    t.ns.clone().unwrap_or_default(),
                    name.clone(),
                )) {
                    return status(
                        409,
                        "AlreadyExists",
                        &format!("{} {name:?} already exists", k.plural),
                    );
                }
                let stored = self.store(&mut st, t.kind, obj, None);
                ok_json(201, &stored)
            }
            (Method::PUT, Some(name), None) => {
                let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "invalid JSON");
                };
                let mut st = self.lock();
                let key = (t.kind, t.ns.clone().unwrap_or_default(), name.to_string());
                let Some(cur) = st.objects.get(&key) else {
                    return status(404, "NotFound", &format!("{} {name:?} not found", k.plural));
                };
                if let Some(want) = obj["metadata"]["resourceVersion"].as_str()
                    && Some(want) != cur["metadata"]["resourceVersion"].as_str()
                {
                    return status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
                let stored = self.store(&mut st, t.kind, obj, Some("MODIFIED"));
                ok_json(200, &stored)
            }
            (Method::PATCH, Some(name), sub) => {
                if !ct.starts_with("application/merge-patch+json") {
                    return status(
                        415,
                        "UnsupportedMediaType",
                        &format!("patch type {ct:?} is not supported by the fake"),
                    );
                }
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "invalid JSON");
                };
                let mut st = self.lock();
                let key = (t.kind, t.ns.clone().unwrap_or_default(), name.to_string());
                let Some(mut obj) = st.objects.get(&key).cloned() else {
                    return status(404, "NotFound", &format!("{} {name:?} not found", k.plural));
                };
                if sub == Some("status") {
                    if let Some(s) = patch.get("status") {
                        merge(&mut obj["status"], s);
                    }
                } else {
                    merge(&mut obj, &patch);
                }
                let stored = self.store(&mut st, t.kind, obj, Some("MODIFIED"));
                ok_json(200, &stored)
            }
            (m, _, _) => status(
                405,
                "MethodNotAllowed",
                &format!("{m} not supported by the fake"),
            ),
        }
    }

    fn watch(
        &self,
        t: &Target,
        q: &BTreeMap<String, String>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let k = KINDS[t.kind];
        let matches = {
            let (kind, ns, ls, fs) = (
                t.kind,
                t.ns.clone(),
                q.get("labelSelector").cloned(),
                q.get("fieldSelector").cloned(),
            );
            move |e: &Ev| {
                e.kind == kind
                    && ns
                        .as_ref()
                        .is_none_or(|n| e.obj["metadata"]["namespace"].as_str() == Some(n))
                    && ls.as_ref().is_none_or(|s| labels_match(&e.obj, s))
                    && fs.as_ref().is_none_or(|s| fields_match(&e.obj, s))
            }
        };
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1024);
        let line = |v: Value| Ok(Frame::data(Bytes::from(format!("{v}\n"))));
        let st = self.lock();
        if st.fail_watches {
            return status(500, "InternalError", "watch outage (injected by the test)");
        }
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bookmark = move |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            json!({"type": "BOOKMARK", "object": {"kind": k.kind, "apiVersion": k.api_version, "metadata": meta}})
        };
        let mut initial = Vec::new();
        if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
            for ((ki, ns, _), v) in &st.objects {
                let e = Ev {
                    rv: 0,
                    kind: *ki,
                    typ: "ADDED",
                    obj: v.clone(),
                };
                if *ki == t.kind && t.ns.as_ref().is_none_or(|n| n == ns) && matches(&e) {
                    initial.push(json!({"type": "ADDED", "object": v}));
                }
            }
            initial.push(bookmark(st.rv, true));
        } else if from != 0 && from < st.compacted {
            let v = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {from} ({})", st.compacted), "reason": "Expired", "code": 410}});
            let _ = tx.try_send(line(v));
            drop(tx);
            return self.stream_response(rx);
        } else {
            for e in st.history.iter().filter(|e| e.rv > from && matches(e)) {
                initial.push(json!({"type": e.typ, "object": e.obj}));
            }
        }
        let mut live = self.live.subscribe();
        let mut close = self.close.subscribe();
        let current = st.rv;
        drop(st);
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(290)
            .min(290);
        let state = Arc::clone(&self.state);
        tokio::spawn(async move {
            for v in initial {
                if tx.send(line(v)).await.is_err() {
                    return;
                }
            }
            let mut last = current;
            let end = tokio::time::sleep(Duration::from_secs(timeout));
            tokio::pin!(end);
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                // Biased so that a test's `close_watches()` wins over events that were
                // published after it: an unbiased select could deliver such an event on the
                // stream that was meant to be closed already.
                tokio::select! {
                    biased;
                    _ = close.changed() => return,
                    _ = &mut end => return,
                    _ = tick.tick() => {
                        let rv = state.lock().map(|s| s.rv).unwrap_or(last).max(last);
                        if tx.send(line(bookmark(rv, false))).await.is_err() { return; }
                    }
                    ev = live.recv() => match ev {
                        Ok(e) => {
                            last = last.max(e.rv);
                            if e.rv > current && matches(&e) && tx.send(line(json!({"type": e.typ, "object": e.obj}))).await.is_err() {
                                return;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        });
        self.stream_response(rx)
    }

    fn stream_response(
        &self,
        rx: mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let o =
            json!({"type": "kubernetes.io/tls", "metadata": {"name": "x", "labels": {"a": "1"}}});
        assert!(labels_match(&o, "a=1"));
        assert!(labels_match(&o, "a"));
        assert!(!labels_match(&o, "!a"));
        assert!(labels_match(&o, "a!=2,!b"));
        assert!(fields_match(&o, "type=kubernetes.io/tls"));
        assert!(!fields_match(&o, "metadata.name=y"));
        assert_eq!(
            decode("kubernetes.io%2Fservice-name%3Dweb"),
            "kubernetes.io/service-name=web"
        );
    }
}
