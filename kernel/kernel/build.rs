//! Link the embedded CPython with an rpath so `rlm` runs without `LD_LIBRARY_PATH`, and set
//! pyo3's cfgs (`Py_LIMITED_API` when the Python package builds for the stable ABI).
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
    println!("cargo::rustc-check-cfg=cfg(Py_LIMITED_API)");
    pyo3_build_config::add_libpython_rpath_link_args();
}
