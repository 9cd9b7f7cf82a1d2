//! The process-wide embedded interpreter: initialised once, patched once (routed stdio, no
//! stdin, interruptible `time.sleep`), shared by every session through the GIL.

use std::ffi::CString;
use std::sync::OnceLock;

use pyo3::prelude::*;

use super::error::ReplError;

const SUPPORT_SOURCE: &str = include_str!("support.py");

/// Handles into the support module (`support.py`), valid for the life of the process.
#[derive(Debug)]
pub(crate) struct Interpreter {
    pub(crate) support: Py<PyModule>,
}

static INTERPRETER: OnceLock<Result<Interpreter, String>> = OnceLock::new();

/// The interpreter, initialising it on first use.
pub(crate) fn interpreter() -> Result<&'static Interpreter, ReplError> {
    INTERPRETER
        .get_or_init(init)
        .as_ref()
        .map_err(|message| ReplError::Interpreter {
            message: message.clone(),
        })
}

fn init() -> Result<Interpreter, String> {
    Python::initialize();
    Python::attach(|py| {
        let source = CString::new(SUPPORT_SOURCE).map_err(|e| e.to_string())?;
        let support = PyModule::from_code(py, &source, c"<rlm-kernel>", c"_rlm_kernel")
            .map_err(|e| format!("loading the kernel support module failed: {e}"))?;
        let sys = py.import("sys").map_err(|e| e.to_string())?;
        sys.getattr("modules")
            .and_then(|m| m.set_item("_rlm_kernel", &support))
            .map_err(|e| e.to_string())?;
        support
            .call_method1("install", (sys,))
            .map_err(|e| format!("patching the interpreter failed: {e}"))?;
        Ok(Interpreter {
            support: support.unbind(),
        })
    })
}

impl Interpreter {
    pub(crate) fn support<'py>(&self, py: Python<'py>) -> &Bound<'py, PyModule> {
        self.support.bind(py)
    }
}
