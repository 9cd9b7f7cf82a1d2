//! The mock server's error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading a script or building a [`super::MockConfig`].
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// The script file could not be read.
    #[error("Cannot read mock script `{path}`: {error}; check the path and its permissions")]
    ReadScript {
        /// The file that was read.
        path: PathBuf,
        /// The I/O error, in the message (not a `source`, or error chains would say it twice).
        error: std::io::Error,
    },
    /// The script is not valid JSON or does not have the documented shape.
    #[error(
        "Mock script `{origin}` is invalid: {message}; see the format in the `bridge::mock` docs (`bridge/src/mock/mod.rs`; a sample: `bridge/src/mock/scripts/sample.json`)"
    )]
    InvalidScript {
        /// The file name, or `<string>` for scripts given as text.
        origin: String,
        /// What is wrong and where (`models."root".rules[1].last_user: ...`).
        message: String,
    },
    /// A latency, fault or option value is out of range or inconsistent.
    #[error("Invalid mock server configuration: {0}")]
    InvalidConfig(String),
}
