//! The controller suite's two API servers behind one face: the in-repo fake, and a real
//! kube-apiserver ([`crate::real_api`]). The same test bodies run against both; what only the
//! fake can do (outages, compaction, failing every request) is reached through [`TestApi::fake`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use serde_json::Value;

use crate::fake_api::{FakeApi, Logged};
use crate::real_api::{PRIVATE_NET, RealApi};

/// The namespace and ServiceAccount the shipped manifests run the controller as.
pub const CONTROLLER_NAMESPACE: &str = "sluice-system";
/// See [`CONTROLLER_NAMESPACE`].
pub const CONTROLLER_ACCOUNT: &str = "sluice";

/// An API server for one test.
#[derive(Debug)]
pub enum TestApi {
    /// `tests/src/fake_api/` on 127.0.0.1.
    Fake(FakeApi),
    /// A real kube-apiserver inside the test's network namespace, with the RBAC objects of
    /// `manifests/base` installed.
    Real(Box<RealApi>),
}

impl TestApi {
    /// The fake.
    pub async fn fake() -> Self {
        TestApi::Fake(FakeApi::start().await)
    }

    /// A real server with the shipped ServiceAccount, ClusterRole, Role and bindings (only
    /// inside [`crate::real_api::in_private_network`]).
    pub async fn real() -> Self {
        let api = RealApi::start(IpAddr::V4(private(1))).await;
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base");
        for file in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"] {
            let yaml = std::fs::read_to_string(base.join(file))
                .unwrap_or_else(|e| panic!("manifests/base/{file}: {e}"));
            for o in crate::yaml_objects(&yaml) {
                api.apply(o).await;
            }
        }
        TestApi::Real(Box::new(api))
    }

    /// Whether this is the real server.
    pub fn is_real(&self) -> bool {
        matches!(self, TestApi::Real(_))
    }

    /// The fake, for what only it can do.
    pub fn fake_only(&self) -> Option<&FakeApi> {
        match self {
            TestApi::Fake(f) => Some(f),
            TestApi::Real(_) => None,
        }
    }

    /// The real server.
    pub fn real_only(&self) -> Option<&RealApi> {
        match self {
            TestApi::Real(r) => Some(r),
            TestApi::Fake(_) => None,
        }
    }

    /// Where a test backend listens so that an EndpointSlice may name it: loopback for the
    /// fake; for the real server, which refuses loopback endpoints, the private block.
    pub fn backend_addr(&self) -> SocketAddr {
        match self {
            TestApi::Fake(_) => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            TestApi::Real(_) => SocketAddr::from((private(1), 0)),
        }
    }

    /// Creates or updates every object of a multi-document YAML.
    pub async fn apply_yaml(&self, yaml: &str) {
        for o in crate::yaml_objects(yaml) {
            match self {
                TestApi::Fake(f) => {
                    f.apply(o);
                }
                TestApi::Real(r) => r.apply(o).await,
            }
        }
    }

    /// Deletes an object.
    pub async fn delete(&self, kind: &str, ns: &str, name: &str) -> bool {
        match self {
            TestApi::Fake(f) => f.delete(kind, ns, name),
            TestApi::Real(r) => r.delete(kind, ns, name).await,
        }
    }

    /// An object as JSON.
    pub async fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        match self {
            TestApi::Fake(f) => f.get(kind, ns, name),
            TestApi::Real(r) => r.get(kind, ns, name).await,
        }
    }

    /// Every object of a kind.
    pub async fn list(&self, kind: &str) -> Vec<Value> {
        match self {
            TestApi::Fake(f) => f.list(kind),
            TestApi::Real(r) => r.list(kind).await,
        }
    }

    /// The requests the controller made (the fake's log; the real server's audit log, only the
    /// controller's ServiceAccount).
    pub fn controller_requests(&self) -> Vec<Logged> {
        match self {
            TestApi::Fake(f) => f.requests(),
            TestApi::Real(r) => r
                .requests()
                .into_iter()
                .filter(|a| a.user == controller_user())
                .map(|a| a.request)
                .collect(),
        }
    }

    /// Starts `sluice controller` in-process against this server: as the shipped
    /// ServiceAccount on the real one, its Lease in the namespace the manifests give it rights in.
    pub async fn controller(&self, identity: &str, extra: &[&str]) -> sluice::kube::Controlling {
        let client = self.controller_client().await;
        self.start_controller(client, identity, extra).await
    }

    /// The kube client the controller uses (for the real server, a token for the shipped
    /// ServiceAccount, which needs the server to answer).
    pub async fn controller_client(&self) -> kube::Client {
        match self {
            TestApi::Fake(f) => crate::kube_client(f),
            TestApi::Real(r) => r.client_as(CONTROLLER_NAMESPACE, CONTROLLER_ACCOUNT).await,
        }
    }

    /// Starts `sluice controller` with a client from [`TestApi::controller_client`].
    pub async fn start_controller(
        &self,
        client: kube::Client,
        identity: &str,
        extra: &[&str],
    ) -> sluice::kube::Controlling {
        let mut args = Vec::new();
        if self.is_real() {
            args.extend(["--election-namespace", CONTROLLER_NAMESPACE]);
        }
        args.extend_from_slice(extra);
        crate::controller_with(client, identity, &args).await
    }
}

/// The user name the real server gives the controller's ServiceAccount.
pub fn controller_user() -> String {
    format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_ACCOUNT}")
}

/// An address of the private block ([`PRIVATE_NET`]`.n`).
pub fn private(n: u8) -> Ipv4Addr {
    let mut octets = [198, 18, 0, n];
    if let Some(third) = PRIVATE_NET.split('.').nth(2).and_then(|s| s.parse().ok()) {
        octets[2] = third;
    }
    Ipv4Addr::from(octets)
}

/// A two-worker runtime for the real-server variants (they run in a thread of their own,
/// inside their network namespace).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Fails when the real server refused any of the controller's requests: the shipped RBAC must
/// allow everything the controller does.
pub fn assert_no_denials(api: &TestApi) {
    let Some(real) = api.real_only() else { return };
    let denied: Vec<_> = real
        .requests()
        .into_iter()
        .filter(|a| a.user == controller_user() && a.code == 403)
        .collect();
    assert!(
        denied.is_empty(),
        "the shipped RBAC denied the controller: {denied:#?}"
    );
}

/// Defines `$fake` and `$real`, running `$body` against each server. The real variant also
/// checks that the shipped RBAC let the controller do everything it tried (no 403).
#[macro_export]
macro_rules! on_both {
    ($body:ident, $fake:ident, $real:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $fake() {
            $body(&$crate::apis::TestApi::fake().await).await;
        }

        $crate::real_only!(@then $body, $real, $crate::apis::assert_no_denials);
    };
}

/// Defines `$real`, running `$body` against the real server only (in its network namespace);
/// with `@then`, a check on the server afterwards.
#[macro_export]
macro_rules! real_only {
    ($body:ident, $real:ident) => {
        $crate::real_only!(@then $body, $real, |_: &$crate::apis::TestApi| {});
    };
    (@then $body:ident, $real:ident, $after:expr) => {
        #[test]
        #[cfg_attr(
            no_real_apiserver,
            ignore = "needs root, unshare and ip, and target/kube-apiserver (tests/kube-apiserver/build.sh)"
        )]
        fn $real() {
            if !$crate::real_api::in_private_network(stringify!($real)) {
                return;
            }
            $crate::apis::runtime().block_on(async {
                let api = $crate::apis::TestApi::real().await;
                $body(&api).await;
                ($after)(&api);
            });
        }
    };
}
