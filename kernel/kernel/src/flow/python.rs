//! Calling a Python function named in a workflow file inside the run's REPL session.
//!
//! A [`PyFunction`] is `module:function` / `module.function` (imported from `sys.path`, with
//! the workflow file's folder in front) or `path/to/file.py:function` (relative to the
//! workflow file). [`PyFunction::call`] sends one block to the session: load the function,
//! decode the JSON argument, call it, encode `{"out": result, "arg": argument}` — the
//! argument comes back because callbacks change it in place. The helper names are local to
//! one function of the block, so nothing is left in the model's namespace; the two global
//! names a call needs (its function, its result) are numbered per call, so calls from
//! concurrent steps (parallel branches, a reply's tool calls) never read each other's result.
//! [`PyFunction::binding`] is the loading part alone: a workflow tool is bound by it and
//! then described and called as every Python function tool is (`kernel::tools`).
//!
//! A file is loaded afresh for each call, as a module that starts with the session's
//! variables (the contexts, `llm_query`, what earlier blocks made), so a step reads the
//! contexts by name; its own definitions shadow them. An importable module is imported
//! once, as Python does, and sees only its own names.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bridge::CancellationToken;
use serde_json::{Map, Value};

use crate::repl::ReplSession;

/// Where a Python function lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// An importable module.
    Module(String),
    /// A `.py` file.
    File(PathBuf),
}

/// A Python function named in a workflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyFunction {
    origin: Origin,
    function: String,
    /// The workflow file's folder, put in front of `sys.path` for module imports.
    base: PathBuf,
}

/// Why a named Python function cannot be used or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PyCallError {
    /// The reference is not `module:function`, `module.function` or `file.py:function`.
    #[error(
        "`{0}` does not name a Python function; write `module:function`, `module.function` or \
         `path/to/file.py:function`"
    )]
    BadReference(String),
    /// The function raised (or could not be loaded).
    #[error("{type_name}: {message}\n{traceback}")]
    Raised {
        /// The exception class.
        type_name: String,
        /// `str(exception)`.
        message: String,
        /// The traceback.
        traceback: String,
    },
    /// The session could not run the block.
    #[error("The Python session failed: {0}")]
    Session(String),
    /// What came back is not the JSON the kernel wrote.
    #[error("The step's result could not be read back: {0}")]
    Result(String),
}

impl PyFunction {
    /// Parses `reference`; a file path is relative to `base` (the workflow file's folder).
    pub fn parse(reference: &str, base: &Path) -> Result<Self, PyCallError> {
        let bad = || PyCallError::BadReference(reference.to_owned());
        let (origin, function) = match reference.rsplit_once(':') {
            Some((place, function)) if place.ends_with(".py") => {
                (Origin::File(base.join(place)), function)
            }
            Some((module, function)) => (Origin::Module(module.to_owned()), function),
            None => {
                let (module, function) = reference.rsplit_once('.').ok_or_else(bad)?;
                (Origin::Module(module.to_owned()), function)
            }
        };
        let identifier = |s: &str| {
            let mut chars = s.chars();
            matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
                && chars.all(|c| c.is_alphanumeric() || c == '_')
        };
        let module_ok = match &origin {
            Origin::Module(m) => m.split('.').all(identifier),
            Origin::File(_) => true,
        };
        if !identifier(function) || !module_ok {
            return Err(bad());
        }
        Ok(Self {
            origin,
            function: function.to_owned(),
            base: base.to_owned(),
        })
    }

    /// The function's own name (without its module or file).
    pub fn name(&self) -> &str {
        &self.function
    }

    /// How the file names it.
    pub fn display(&self) -> String {
        match &self.origin {
            Origin::Module(m) => format!("{m}:{}", self.function),
            Origin::File(f) => format!("{}:{}", f.display(), self.function),
        }
    }

    /// Python statements, indented by four spaces, that bind the function to `_fn` inside a
    /// function of a block (`importlib` and `sys` imported there).
    pub fn binding(&self) -> String {
        let imports = "    import importlib, importlib.util, sys\n";
        match &self.origin {
            Origin::Module(module) => format!(
                "{imports}    _base = {base}\n    if _base not in sys.path:\n        sys.path.insert(0, _base)\n    \
                 _fn = getattr(importlib.import_module({module}), {function})\n",
                base = py_str(&self.base.display().to_string()),
                module = py_str(module),
                function = py_str(&self.function),
            ),
            Origin::File(path) => format!(
                "{imports}    _spec = importlib.util.spec_from_file_location('rlm_flow_step', {path})\n    \
                 if _spec is None or _spec.loader is None:\n        \
                 raise ImportError('cannot load ' + {path})\n    \
                 _mod = importlib.util.module_from_spec(_spec)\n    \
                 _g = globals()\n    \
                 _mod.__dict__.update({{k: v for k, v in _g.items() if not k.startswith('_')}})\n    \
                 _spec.loader.exec_module(_mod)\n    _fn = getattr(_mod, {function})\n",
                path = py_str(&path.display().to_string()),
                function = py_str(&self.function),
            ),
        }
    }

    /// Where the function is, for messages: `` `path/to/file.py` `` or `` module `steps` ``.
    pub fn place(&self) -> String {
        match &self.origin {
            Origin::Module(m) => format!("module `{m}`"),
            Origin::File(f) => format!("`{}`", f.display()),
        }
    }

    /// Calls the function with `arg` and keyword arguments `kwargs` in `session` (blocks;
    /// `stop` interrupts it). Returns what it returned and the argument as it left it.
    pub fn call(
        &self,
        session: &ReplSession,
        arg: &Value,
        kwargs: &Map<String, Value>,
        stop: &CancellationToken,
    ) -> Result<(Value, Value), PyCallError> {
        let load = self.binding();
        let n = CALLS.fetch_add(1, Ordering::Relaxed);
        let out_var = format!("{OUT}_{n}");
        let code = format!(
            "def __rlm_flow_call_{n}():\n    import json\n{load}    \
             _arg = json.loads({arg})\n    _out = _fn(_arg, **json.loads({kwargs}))\n    \
             return json.dumps({{'out': _out, 'arg': _arg}})\n\
             {out_var} = __rlm_flow_call_{n}()\ndel __rlm_flow_call_{n}\n",
            arg = py_str(&arg.to_string()),
            kwargs = py_str(&Value::Object(kwargs.clone()).to_string()),
        );
        let session_error = |e: crate::repl::ReplError| PyCallError::Session(e.to_string());
        let ran = session.exec_until_stopped(&code, stop);
        if stop.is_cancelled() {
            session.interrupt();
        }
        let ran = ran.map_err(session_error)?;
        let read = session.variable_as_string(&out_var).map_err(session_error);
        // Leave nothing behind, whatever happened.
        let _ = session.exec(&format!("globals().pop({}, None)", py_str(&out_var)));
        if let Some(error) = ran.error {
            return Err(PyCallError::Raised {
                type_name: error.type_name,
                message: error.message,
                traceback: error.traceback,
            });
        }
        let text = read?.ok_or_else(|| PyCallError::Result("no result was set".to_owned()))?;
        let mut both: Map<String, Value> =
            serde_json::from_str(&text).map_err(|e| PyCallError::Result(e.to_string()))?;
        let out = both.remove("out").unwrap_or(Value::Null);
        let arg = both.remove("arg").unwrap_or(Value::Null);
        Ok((out, arg))
    }
}

/// The variable the call's JSON result is left in, for one read (numbered per call).
const OUT: &str = "__rlm_flow_out";

/// Calls so far in this process: the number of the next call's global names.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// `text` as a Python string literal (a JSON string is one, as serde writes it).
fn py_str(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_in_three_forms() {
        let base = Path::new("/flows");
        let m = PyFunction::parse("steps:format_answer", base).expect("module:function");
        assert_eq!(m.display(), "steps:format_answer");
        let d = PyFunction::parse("pkg.steps.format_answer", base).expect("dotted");
        assert_eq!(d.display(), "pkg.steps:format_answer");
        let f = PyFunction::parse("lib/steps.py:run", base).expect("file");
        assert_eq!(f.display(), "/flows/lib/steps.py:run");
        for bad in ["nofunction", "steps:", "a b:c", "steps:1x", ":f"] {
            assert!(
                matches!(
                    PyFunction::parse(bad, base),
                    Err(PyCallError::BadReference(_))
                ),
                "{bad}"
            );
        }
    }
}
