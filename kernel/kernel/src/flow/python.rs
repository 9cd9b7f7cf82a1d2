//! Calling a Python function named in a workflow file inside the run's REPL session.
//!
//! A [`PyFunction`] is `module:function` / `module.function` (imported from `sys.path`, with
//! the workflow file's folder in front) or `path/to/file.py:function` (relative to the
//! workflow file). [`PyFunction::call`] runs one block in the session that binds the
//! function and hands it to the tools' support module (`kernel::tools`), which calls it as
//! its [`FunctionKind`] says and leaves the JSON of what happened under the call's token
//! (the tools' one `Outcome`, read here as a tool's call reads it): the value returned, the
//! argument as the function left it (callbacks change it in place), and the state writes and
//! actions it reported ([`Effects`]) — the one convention every Python function of a
//! workflow follows, tools included. Nothing is left in the session's
//! namespace, and calls from concurrent steps (parallel branches, a reply's tool calls)
//! never read each other's result.
//!
//! The workflow's state is not sent with every call: the session keeps a copy of it, which
//! each call catches up with the writes made since the session last saw it (the state's
//! [`SharedState::catch_up`]: the whole state once, then writes), so a call costs what
//! changed, not the size of the state — with the state sent whole each time, a run's work grew
//! with the square of its steps. A session that does not have the copy the writes follow (a
//! new session, one restarted after a crash or a time limit, another session that caught up
//! meanwhile) says so, and the call is sent again with the whole state. The function never
//! gets the kept copy itself (see the support module's `call_flow`).
//!
//! [`PyFunction::binding`] is the loading part: a workflow tool is bound by it and then
//! described and called as every Python function tool is.
//!
//! A file is loaded afresh for each call, as a module that starts with the session's
//! variables (the contexts, `llm_query`, what earlier blocks made), so a step reads the
//! contexts by name; its own definitions shadow them. An importable module is imported
//! once, as Python does, and sees only its own names.

use std::path::{Path, PathBuf};

use bridge::CancellationToken;
use engine::{CatchUp, Mirror, SharedState, State, StateDelta};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::repl::ReplSession;
use crate::tools::{Effects, Outcome, function_block, python_str, run_entry};

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
    /// The function's form or result does not fit its kind; the text says how to write it.
    #[error("{0}")]
    Refused(String),
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

    /// The folder its code is read from: the `.py` file's, or the workflow's for a module
    /// (an isolated session's worker is allowed to read it).
    pub fn folder(&self) -> &Path {
        match &self.origin {
            Origin::File(path) => path.parent().unwrap_or(&self.base),
            Origin::Module(_) => &self.base,
        }
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
                base = python_str(&self.base.display().to_string()),
                module = python_str(module),
                function = python_str(&self.function),
            ),
            Origin::File(path) => format!(
                "{imports}    _spec = importlib.util.spec_from_file_location('rlm_flow_step', {path})\n    \
                 if _spec is None or _spec.loader is None:\n        \
                 raise ImportError('cannot load ' + {path})\n    \
                 _mod = importlib.util.module_from_spec(_spec)\n    \
                 _g = globals()\n    \
                 _mod.__dict__.update({{k: v for k, v in _g.items() if not k.startswith('_')}})\n    \
                 _spec.loader.exec_module(_mod)\n    _fn = getattr(_mod, {function})\n",
                path = python_str(&path.display().to_string()),
                function = python_str(&self.function),
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

    /// Calls the function as a `kind` with keyword arguments `kwargs` in `session` (blocks;
    /// `stop` interrupts it). Its argument is `arg` — the state as a `Value`, or a
    /// callback's `ctx` — or, given `state`, the state kept in the session and caught up from
    /// `state` (a step's and a state function's argument; a callback's `ctx["state"]`, `arg`
    /// holding the rest of its `ctx`).
    pub fn call(
        &self,
        session: &ReplSession,
        kind: FunctionKind,
        arg: &Value,
        state: Option<&SharedState>,
        kwargs: &Map<String, Value>,
        stop: &CancellationToken,
    ) -> Result<Called, PyCallError> {
        let (binding, name) = (self.binding(), python_str(&self.function));
        let kind = python_str(kind.name());
        let arg = python_str(&arg.to_string());
        let kwargs = python_str(&Value::Object(kwargs.clone()).to_string());
        let mut mirror = state.map(SharedState::catch_up);
        loop {
            let sync = match &mirror {
                Some(mirror) => python_str(&Sync::of(mirror).to_json()?),
                None => "None".to_owned(),
            };
            let mut sent = 0;
            let (result, out) = run_entry(session, stop, |token| {
                let block = function_block(
                    token,
                    &binding,
                    &format!("call_flow(_fn, {name}, {kind}, {token}, {arg}, {kwargs}, {sync})"),
                );
                sent = block.len();
                block
            })
            .map_err(|e| PyCallError::Session(e.to_string()))?;
            tracing::debug!(
                function = %self.display(),
                bytes = sent,
                whole_state = is_full(mirror.as_ref()),
                "Python function called"
            );
            match (Self::called(session, stop, result, out, sent)?, state) {
                // The session does not have the copy the writes follow: send the whole state.
                (Reply::Stale, Some(state)) if !is_full(mirror.as_ref()) => {
                    mirror = Some(state.catch_up_full());
                }
                (Reply::Stale, _) => {
                    return Err(PyCallError::Result(
                        "the session did not take the state it was sent".to_owned(),
                    ));
                }
                (Reply::Called(called), _) => return Ok(called),
            }
        }
    }

    /// What a call's block left: the call, or that the session's copy of the state is stale.
    fn called(
        session: &ReplSession,
        stop: &CancellationToken,
        result: crate::repl::ExecutionResult,
        out: Option<String>,
        sent: usize,
    ) -> Result<Reply, PyCallError> {
        if stop.is_cancelled() {
            session.interrupt();
        }
        if let Some(error) = result.error {
            return Err(PyCallError::Raised {
                type_name: error.type_name,
                message: error.message,
                traceback: error.traceback,
            });
        }
        let text = out.ok_or_else(|| PyCallError::Result("no result was set".to_owned()))?;
        match Outcome::parse(&text).map_err(|e| PyCallError::Result(e.to_string()))? {
            Outcome::Returned {
                value,
                arg,
                effects,
            } => Ok(Reply::Called(Called {
                value,
                arg,
                effects,
                sent,
            })),
            Outcome::Stale => Ok(Reply::Stale),
            Outcome::Invalid(message) => Err(PyCallError::Refused(message)),
            Outcome::Raised {
                type_name,
                message,
                traceback,
            } => Err(PyCallError::Raised {
                type_name,
                message,
                traceback,
            }),
        }
    }
}

/// Whether `mirror` sends the whole state.
fn is_full(mirror: Option<&Mirror>) -> bool {
    matches!(
        mirror,
        Some(Mirror {
            catch_up: CatchUp::Full(_),
            ..
        })
    )
}

/// A call's block's reply.
enum Reply {
    Called(Called),
    /// The session's copy of the state is not the one the writes follow.
    Stale,
}

/// How a [`Mirror`] travels to the support module's `call_flow` (`sync_json`).
#[derive(Serialize)]
struct Sync<'a> {
    id: u64,
    to: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a State>,
    #[serde(skip_serializing_if = "Option::is_none")]
    writes: Option<&'a StateDelta>,
}

impl<'a> Sync<'a> {
    fn of(mirror: &'a Mirror) -> Self {
        let (from, state, writes) = match &mirror.catch_up {
            CatchUp::Full(state) => (None, Some(state), None),
            CatchUp::Writes { from, writes } => (Some(*from), None, Some(writes)),
        };
        Self {
            id: mirror.id,
            to: mirror.to,
            from,
            state,
            writes,
        }
    }

    fn to_json(&self) -> Result<String, PyCallError> {
        serde_json::to_string(self).map_err(|e| PyCallError::Result(e.to_string()))
    }
}

/// What kind of workflow function a [`PyFunction`] is: how it is called, and the parameter
/// its context arrives in (as Google ADK names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    /// A `PythonAgent`: `ctx`, or (the form documented first) the state as a dict,
    /// returning a dict of updates.
    Step,
    /// A callback: `callback_context`, or (the form documented first) one `ctx` dict.
    Callback,
    /// A `python` test of a condition or gate: the state as a dict, returning a value.
    StateFunction,
}

impl FunctionKind {
    fn name(self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::Callback => "callback",
            Self::StateFunction => "state_function",
        }
    }
}

/// What a call returned.
#[derive(Debug, Default)]
pub struct Called {
    /// What the function returned (a step: its message, or `null`).
    pub value: Value,
    /// The argument as the function left it (a callback's `ctx`: its `request`, `tool`, ...).
    pub arg: Value,
    /// The state writes and actions it reported.
    pub(crate) effects: Effects,
    /// The bytes of the block that called it (its arguments, and the state or the writes
    /// that caught the session's copy up).
    pub sent: usize,
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
