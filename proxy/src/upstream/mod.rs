//! Everything on the upstream side of a request: clusters (one per pool) and their endpoints,
//! balancing, the connection pool, sluice's HTTP/1 client and hyper's h2 client, upstream TLS,
//! the body types that cross the proxy, the retry rules ([`retry`]), and the call to an
//! operator-allowed auth service outside the cluster ([`remote`]).

pub mod balance;
pub mod body;
pub mod cluster;
pub mod endpoint;
pub mod h1;
pub mod hash;
pub mod pool;
pub mod remote;
pub mod retry;
pub mod tls;
