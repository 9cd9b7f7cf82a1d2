//! Integration tests of the kernel.
