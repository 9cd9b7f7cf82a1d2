//! The mock LM server.
