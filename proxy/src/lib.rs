//! data plane
