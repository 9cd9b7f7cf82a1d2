//! [`PythonStateFunction`]: a Python function `(state) -> value` named by a `python` test of
//! a condition or quality gate in a workflow file.
//!
//! The function gets a copy of the state as a dict and runs in the run's REPL session. The
//! engine decides what its value means (a condition holds when it is truthy; a gate passes
//! on `True` or `{"passed": True}`). Like callbacks, the call is synchronous: routing waits
//! for it.

use std::sync::Arc;

use bridge::CancellationToken;
use engine::State;
use engine::condition::StateFunction;
use serde_json::{Map, Value};

use super::python::{FunctionKind, PyFunction};
use super::services::FlowKernel;

/// A Python function of the state; see the module docs.
pub struct PythonStateFunction {
    function: PyFunction,
    kernel: Arc<FlowKernel>,
}

impl std::fmt::Debug for PythonStateFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PythonStateFunction({})", self.function.display())
    }
}

impl PythonStateFunction {
    /// `function`, called in `kernel`'s session.
    pub fn new(function: PyFunction, kernel: Arc<FlowKernel>) -> Self {
        Self { function, kernel }
    }
}

impl StateFunction for PythonStateFunction {
    fn call(&self, state: &State) -> Result<Value, String> {
        let session = self.kernel.session().map_err(|e| e.to_string())?;
        let state = Value::Object(state.to_map());
        self.function
            .call(
                &session,
                FunctionKind::StateFunction,
                &state,
                None,
                &Map::new(),
                &CancellationToken::new(),
            )
            .map(|called| called.value)
            .map_err(|e| e.to_string())
    }
}
