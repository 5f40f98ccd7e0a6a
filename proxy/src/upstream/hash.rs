//! Stable hashes for rendezvous hashing: the same on every sluice replica and release (unlike
//! std's seeded hasher), so every replica maps a key to the same pod.

use std::net::{IpAddr, SocketAddr};

/// FNV-1a, 64 bit: stable across processes and releases (unlike std's hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The stable identity of an endpoint for rendezvous hashing.
pub fn endpoint_hash(addr: &SocketAddr) -> u64 {
    let mut buf = [0u8; 18];
    let n = match addr.ip() {
        IpAddr::V4(v4) => {
            buf[..4].copy_from_slice(&v4.octets());
            4
        }
        IpAddr::V6(v6) => {
            buf[..16].copy_from_slice(&v6.octets());
            16
        }
    };
    buf[n..n + 2].copy_from_slice(&addr.port().to_be_bytes());
    fnv1a(&buf[..n + 2])
}
