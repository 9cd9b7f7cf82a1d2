//! Context loading: every kind, metadata, and clear errors for bad files.
