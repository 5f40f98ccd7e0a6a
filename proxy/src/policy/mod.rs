//! Each route's compiled policy: what the route table holds per route besides its pool —
//! authentication gates ([`auth`]: Basic, Digest, `auth-url`, client certificates), the
//! ingress-nginx edits and canary rules ([`edits`]), and request limiters ([`limits`]). Compiled
//! from the snapshot's route edits by `state::routes`, asked by the handlers; nothing here is
//! swapped on its own.

pub mod auth;
pub mod edits;
pub mod limits;
