//! Link the embedded CPython with an rpath so `rlm` runs without `LD_LIBRARY_PATH`.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
