//! The RLM loop.
