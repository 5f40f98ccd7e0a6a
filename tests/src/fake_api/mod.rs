//! A small fake Kubernetes API server for testing the real kube client over HTTP (what it must
//! speak: `tests/README.md`): list, watch with bookmarks, label and field selectors, ERROR 410
//! for expired versions, status PATCH, Lease create/get/replace, Events; plus hooks for tests to
//! apply/delete objects, compact history, fail or close watches, and inspect requests.
//! The requests themselves are answered in `serve.rs`.

mod serve;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// One resource type the fake serves.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    prefix: &'static str,
    plural: &'static str,
    /// `kind`.
    pub kind: &'static str,
    api_version: &'static str,
    namespaced: bool,
}

const KINDS: &[Kind] = &[
    Kind {
        prefix: "/apis/networking.k8s.io/v1",
        plural: "ingresses",
        kind: "Ingress",
        api_version: "networking.k8s.io/v1",
        namespaced: true,
    },
    Kind {
        prefix: "/apis/networking.k8s.io/v1",
        plural: "ingressclasses",
        kind: "IngressClass",
        api_version: "networking.k8s.io/v1",
        namespaced: false,
    },
    Kind {
        prefix: "/api/v1",
        plural: "services",
        kind: "Service",
        api_version: "v1",
        namespaced: true,
    },
    Kind {
        prefix: "/api/v1",
        plural: "secrets",
        kind: "Secret",
        api_version: "v1",
        namespaced: true,
    },
    Kind {
        prefix: "/api/v1",
        plural: "events",
        kind: "Event",
        api_version: "v1",
        namespaced: true,
    },
    Kind {
        prefix: "/api/v1",
        plural: "configmaps",
        kind: "ConfigMap",
        api_version: "v1",
        namespaced: true,
    },
    Kind {
        prefix: "/api/v1",
        plural: "pods",
        kind: "Pod",
        api_version: "v1",
        namespaced: true,
    },
    Kind {
        prefix: "/api/v1",
        plural: "nodes",
        kind: "Node",
        api_version: "v1",
        namespaced: false,
    },
    Kind {
        prefix: "/apis/discovery.k8s.io/v1",
        plural: "endpointslices",
        kind: "EndpointSlice",
        api_version: "discovery.k8s.io/v1",
        namespaced: true,
    },
    Kind {
        prefix: "/apis/coordination.k8s.io/v1",
        plural: "leases",
        kind: "Lease",
        api_version: "coordination.k8s.io/v1",
        namespaced: true,
    },
    Kind {
        prefix: "/apis/events.k8s.io/v1",
        plural: "events",
        kind: "Event",
        api_version: "events.k8s.io/v1",
        namespaced: true,
    },
    // Tests that use other namespaces create them first, as the real API server requires.
    Kind {
        prefix: "/api/v1",
        plural: "namespaces",
        kind: "Namespace",
        api_version: "v1",
        namespaced: false,
    },
];

type ObjKey = (usize, String, String);

#[derive(Debug, Clone)]
struct Ev {
    rv: u64,
    kind: usize,
    typ: &'static str,
    obj: Value,
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Logged {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Raw query.
    pub query: String,
    /// Body (for writes).
    pub body: String,
}

#[derive(Debug)]
struct State {
    rv: u64,
    objects: BTreeMap<ObjKey, Value>,
    history: VecDeque<Ev>,
    compacted: u64,
    fail_watches: bool,
    fail_all: bool,
    requests: Vec<Logged>,
}

/// The fake API server.
#[derive(Debug, Clone)]
pub struct FakeApi {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    live: broadcast::Sender<Ev>,
    close: Arc<watch::Sender<u64>>,
}

impl FakeApi {
    /// Starts the fake on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (live, _) = broadcast::channel(100_000);
        let fake = FakeApi {
            addr,
            state: Arc::new(Mutex::new(State {
                rv: 1000,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                fail_watches: false,
                fail_all: false,
                requests: Vec::new(),
            })),
            live,
            close: Arc::new(watch::channel(0).0),
        };
        let f = fake.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    continue;
                };
                let f = f.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let f = f.clone();
                        async move { Ok::<_, Infallible>(f.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        fake
    }

    /// The URL for `kube::Config::new`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kind_of(v: &Value) -> usize {
        let kind = v["kind"].as_str().unwrap_or_default();
        let api = v["apiVersion"].as_str().unwrap_or_default();
        KINDS
            .iter()
            .position(|k| k.kind == kind && k.api_version == api)
            .unwrap_or_else(|| panic!("fake api: unknown kind {api} {kind}"))
    }

    fn store(
        &self,
        st: &mut State,
        kind: usize,
        mut obj: Value,
        typ: Option<&'static str>,
    ) -> Value {
        st.rv += 1;
        let k = KINDS[kind];
        let ns = if k.namespaced {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        obj["kind"] = json!(k.kind);
        obj["apiVersion"] = json!(k.api_version);
        if k.namespaced {
            obj["metadata"]["namespace"] = json!(ns);
        }
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}-{}", name, st.rv));
        }
        let key = (kind, ns, name);
        let typ = typ.unwrap_or(if st.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        });
        st.objects.insert(key, obj.clone());
        let ev = Ev {
            rv: st.rv,
            kind,
            typ,
            obj: obj.clone(),
        };
        st.history.push_back(ev.clone());
        let _ = self.live.send(ev);
        obj
    }

    /// Creates or replaces an object (from its JSON), emitting ADDED/MODIFIED.
    pub fn apply(&self, obj: Value) -> Value {
        let kind = Self::kind_of(&obj);
        let mut st = self.lock();
        self.store(&mut st, kind, obj, None)
    }

    /// Deletes an object, emitting DELETED with its last state at the deletion's version.
    pub fn delete(&self, kind: &str, ns: &str, name: &str) -> bool {
        let Some(ki) = KINDS
            .iter()
            .position(|k| k.kind == kind && k.prefix != "/apis/events.k8s.io/v1")
        else {
            return false;
        };
        let ns = if KINDS[ki].namespaced {
            ns.to_string()
        } else {
            String::new()
        };
        let mut st = self.lock();
        let Some(mut obj) = st.objects.remove(&(ki, ns, name.to_string())) else {
            return false;
        };
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let ev = Ev {
            rv: st.rv,
            kind: ki,
            typ: "DELETED",
            obj,
        };
        st.history.push_back(ev.clone());
        let _ = self.live.send(ev);
        true
    }

    /// Reads an object.
    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let st = self.lock();
        st.objects
            .iter()
            .find(|((k, n, nm), _)| {
                KINDS[*k].kind == kind && (n == ns || !KINDS[*k].namespaced) && nm == name
            })
            .map(|(_, v)| v.clone())
    }

    /// Objects of a kind.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((k, _, _), _)| KINDS[*k].kind == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Forgets all history: watches from any older version get ERROR 410 (Expired).
    pub fn compact(&self) {
        let mut st = self.lock();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Ends every open watch stream.
    pub fn close_watches(&self) {
        self.close.send_modify(|g| *g += 1);
    }

    /// Makes watch requests fail with 500 (an outage) until turned off.
    pub fn fail_watches(&self, on: bool) {
        self.lock().fail_watches = on;
    }

    /// Makes every request fail with 503 (the API server is unreachable) until turned off.
    pub fn fail_all(&self, on: bool) {
        self.lock().fail_all = on;
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.lock().requests.clone()
    }
}
