//! Integration tests of the bridge over real HTTP against the mock LM server.

mod mock;
