//! Benchmarks live in `benches/benches/`; shared helpers here.
