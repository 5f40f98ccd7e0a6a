//! A call to an auth service outside the cluster (`auth-url: https://auth.example.com/…`),
//! which sluice makes only for hosts the operator allows (`--auth-url-allow`): the name is
//! resolved at each call, every address it resolves to checked against the allowed blocks
//! when it was not allowed by name (so a name re-pointed at an address no one chose is
//! refused), then one connection, HTTP/1.1, over TLS verified against the system's trust
//! store for `https://`. Each step runs under the caller's deadline. No pooling: the answer
//! cache (`auth-cache-key`) is what spares repeated calls.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use sluice_config::route_policy::Remote;
use tokio::net::TcpStream;

/// Why a call could not be made; the text goes to the log with the 500 the client gets.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The name did not resolve.
    #[error("{0}: does not resolve: {1}")]
    Resolve(String, std::io::Error),
    /// An address outside the operator's blocks.
    #[error("{0} resolves to {1}, outside --auth-url-allow")]
    NotAllowed(String, std::net::IpAddr),
    /// No address took the connection.
    #[error("{0}: connect: {1}")]
    Connect(String, std::io::Error),
    /// TLS could not be set up or the handshake failed.
    #[error("{0}: TLS: {1}")]
    Tls(String, String),
    /// The HTTP exchange failed.
    #[error("{0}: {1}")]
    Http(String, hyper::Error),
}

/// The TLS client for remote auth services: the system's roots, HTTP/1.1. `Err` when the
/// system has no roots (every https call then fails, never unverified).
fn tls() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("the system trust store has no certificates".to_string());
            }
            let mut cfg =
                rustls::ClientConfig::builder_with_provider(Arc::new(crate::crypto::provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(cfg))
        })
        .clone()
}

/// The addresses `remote` may be called at now.
async fn addresses(remote: &Remote) -> Result<Vec<SocketAddr>, RemoteError> {
    let o = &remote.origin;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((o.host.as_str(), o.port))
        .await
        .map_err(|e| RemoteError::Resolve(o.host.clone(), e))?
        .collect();
    if addrs.is_empty() {
        return Err(RemoteError::Resolve(
            o.host.clone(),
            std::io::Error::other("no address"),
        ));
    }
    if !remote.by_name
        && let Some(out) = addrs
            .iter()
            .find(|a| !remote.cidrs.iter().any(|c| c.contains(a.ip())))
    {
        return Err(RemoteError::NotAllowed(o.host.clone(), out.ip()));
    }
    Ok(addrs)
}

/// Sends the body-less subrequest `req` to `remote` and returns the answer's head (the body
/// is dropped: an auth answer's body is never used). The caller bounds it with its timeout.
pub async fn send(
    remote: &Remote,
    req: Request<Empty<Bytes>>,
) -> Result<http::response::Parts, RemoteError> {
    let o = &remote.origin;
    let addrs = addresses(remote).await?;
    let mut last = None;
    let mut tcp = None;
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(tcp) = tcp else {
        let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
        return Err(RemoteError::Connect(o.host.clone(), e));
    };
    let _ = tcp.set_nodelay(true);
    if !o.https {
        return exchange(TokioIo::new(tcp), req, &o.host).await;
    }
    let cfg = tls().map_err(|e| RemoteError::Tls(o.host.clone(), e))?;
    let name = ServerName::try_from(o.host.clone())
        .map_err(|e| RemoteError::Tls(o.host.clone(), e.to_string()))?;
    let stream = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| RemoteError::Tls(o.host.clone(), e.to_string()))?;
    exchange(TokioIo::new(stream), req, &o.host).await
}

/// One HTTP/1.1 exchange on a fresh connection.
async fn exchange<T>(
    io: TokioIo<T>,
    req: Request<Empty<Bytes>>,
    host: &str,
) -> Result<http::response::Parts, RemoteError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| RemoteError::Http(host.to_string(), e))?;
    // The connection ends with this task: it is dropped once the answer's head is read.
    let driver = tokio::spawn(conn);
    let answer = sender.send_request(req).await;
    driver.abort();
    answer
        .map(|r| r.into_parts().0)
        .map_err(|e| RemoteError::Http(host.to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::route_policy::Origin;

    fn remote(host: &str, by_name: bool, cidrs: &str) -> Remote {
        Remote {
            origin: Origin {
                https: false,
                host: host.into(),
                port: 9,
            },
            by_name,
            cidrs: sluice_config::Cidr::parse_list(cidrs).unwrap_or_default(),
        }
    }

    #[tokio::test]
    async fn an_address_outside_the_blocks_is_refused_before_any_connection() {
        let r = remote("127.0.0.1", false, "10.0.0.0/8");
        assert!(matches!(
            addresses(&r).await,
            Err(RemoteError::NotAllowed(_, ip)) if ip.is_loopback()
        ));
        let r = remote("127.0.0.1", false, "127.0.0.0/8");
        assert_eq!(addresses(&r).await.map(|a| a.len()).ok(), Some(1));
        // Allowed by name: any address.
        let r = remote("localhost", true, "");
        assert!(addresses(&r).await.is_ok());
        let r = remote("localhost", false, "10.0.0.0/8");
        assert!(matches!(
            addresses(&r).await,
            Err(RemoteError::NotAllowed(..))
        ));
    }
}
