//! Language models over HTTP.

#[cfg(feature = "mock")]
pub mod mock;
