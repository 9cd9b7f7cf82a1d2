//! Language models over HTTP.
