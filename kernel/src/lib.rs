//! The rlm kernel.
