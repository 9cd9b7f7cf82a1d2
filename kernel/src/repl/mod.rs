//! The embedded Python REPL session.
