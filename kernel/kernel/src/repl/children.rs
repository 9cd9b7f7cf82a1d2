//! `rlm_query` and `rlm_query_batched`: sub-calls that are RLM runs of their own.
//!
//! A child is a whole RLM loop — a root model writing code against a REPL of its own whose
//! `context` is the object the code passed — run on the same endpoints, limiter, ledger
//! (so one budget holds for the tree) and sub-call record as its parent. The REPL only asks:
//! a [`ChildRunner`] set on the session ([`ReplSession::set_children`](super::ReplSession::set_children))
//! runs the children, and the RLM loop that owns the session installs one when the run's depth
//! limit allows children ([`crate::rlm`] owns the loop; the REPL does not know it). With an
//! isolated session the runner lives in the parent process, which also runs each child's own
//! worker: model code never starts processes of its own to get a child.
//!
//! Without a runner (the depth limit is reached, or the session was made without a loop),
//! `rlm_query` behaves as `llm_query` — the prompt, followed by `str(context)` when one was
//! given, goes to the sub-model — and says so once per session on the block's stderr, as the
//! reference runtime does.
//!
//! Answers come back as strings in input order; a child that failed (no answer, a budget, a
//! kernel error) is a per-item error like a failed `llm_query_batched` slot: an
//! `"Error: <reason>"` string, or `LlmQueryError` when the session raises. It counts as one
//! too, in the block's `sub_call_errors` (the one count of the slots the code got as errors,
//! whichever call made them), at the one point where that count is kept
//! ([`SubModelBridge::children_answered`], for both isolations: an isolated session's children
//! answer its worker's natives); a child's node in the run tree says what ended it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use tokio_util::sync::CancellationToken;

use super::natives::{
    LlmQuery, LlmQueryBatched, RemoteCalls, SubAnswer, SubModelBridge, WireChild, WireContext,
};
use super::source::{ContextSource, EncodedContext, EncodedFormat, LiveObject};

/// One child run as the code asked for it.
#[derive(Debug, Clone)]
pub(crate) struct ChildQuery {
    /// The child's query.
    pub(crate) prompt: String,
    /// Its `context` (none: the child's REPL has no context).
    pub(crate) context: Option<ContextSource>,
    /// The endpoint of its root model (`None`: the session's sub endpoint).
    pub(crate) model: Option<String>,
    /// Its iteration limit (`None`: the parent's).
    pub(crate) max_iterations: Option<u32>,
}

/// The query of a child an isolated session's worker handed over, as the parent runs it.
pub(crate) fn query_of(child: WireChild) -> ChildQuery {
    ChildQuery {
        prompt: child.prompt,
        context: child.context.map(|context| match context {
            WireContext::Text(text) => ContextSource::Text(text),
            WireContext::Encoded(encoded) => ContextSource::Encoded(encoded),
        }),
        model: child.model,
        max_iterations: child.max_iterations,
    }
}

/// A child's answer, or why there is none (as a failed sub-call's).
pub(crate) type ChildAnswer = SubAnswer;

/// Runs `rlm_query` children for a session (see the [module docs](self)).
pub(crate) trait ChildRunner: Send + Sync + std::fmt::Debug {
    /// Runs `queries` (concurrently, within the run's fan-out width) and hands their answers,
    /// in input order, to `answered` (once) as soon as every child has one: before the last
    /// child's node is recorded and its session closed, so that the code that asked goes on
    /// meanwhile. Returns once every child's node is recorded, or would be but for its runner
    /// (a run's end of block waits for them). `cancel` (the calling block's) stops the
    /// children still running.
    fn run(
        &self,
        queries: Vec<ChildQuery>,
        cancel: &CancellationToken,
        answered: &mut (dyn FnMut(Vec<ChildAnswer>) + Send),
    );
}

/// Where a session finds its runner: set by the loop, read by the natives.
#[derive(Debug, Default)]
pub(crate) struct ChildSlot {
    runner: Mutex<Option<Arc<dyn ChildRunner>>>,
    /// Whether the session already said that `rlm_query` runs as `llm_query`.
    said_flat: AtomicBool,
}

impl ChildSlot {
    pub(crate) fn set(&self, runner: Option<Arc<dyn ChildRunner>>) {
        *self
            .runner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = runner;
    }

    pub(crate) fn get(&self) -> Option<Arc<dyn ChildRunner>> {
        self.runner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Who runs a session's children.
enum Runner {
    /// This process's loop.
    Here(Arc<dyn ChildRunner>),
    /// The parent of this worker process.
    Parent(Arc<dyn RemoteCalls>),
    /// Nobody: `rlm_query` is `llm_query`.
    Flat,
}

fn runner(bridge: &SubModelBridge, slot: &ChildSlot) -> Runner {
    match (bridge.remote(), slot.get()) {
        (Some(remote), _) => Runner::Parent(Arc::clone(remote)),
        (None, Some(runner)) => Runner::Here(runner),
        (None, None) => Runner::Flat,
    }
}

/// Contexts serialised for children in this process (they are named by it).
static ENCODED: AtomicU64 = AtomicU64::new(0);

/// `context` as a worker hands it to its parent: text as it is; a dict, list or tuple as JSON,
/// a polars frame as Parquet, a pandas frame as CSV, each named as the file it would be in the
/// scratch directory (the name only: the bytes go in the frame, and on to the child's worker
/// in a sealed memfd).
fn wire_context(py: Python<'_>, context: &Bound<'_, PyAny>) -> PyResult<WireContext> {
    if let Ok(text) = context.cast::<PyString>() {
        return Ok(WireContext::Text(text.to_cow()?.into_owned()));
    }
    if let Ok(bytes) = context.cast::<PyBytes>() {
        return match std::str::from_utf8(bytes.as_bytes()) {
            Ok(text) => Ok(WireContext::Text(text.to_owned())),
            Err(_) => Err(PyTypeError::new_err(
                "rlm_query() `context` bytes must be UTF-8 text; decode them first",
            )),
        };
    }
    let kind = context.get_type();
    let module: String = kind.getattr("__module__")?.extract().unwrap_or_default();
    let name = kind.name()?.to_cow()?.into_owned();
    let (format, bytes) = if context.is_instance_of::<PyDict>()
        || context.is_instance_of::<PyList>()
        || context.is_instance_of::<PyTuple>()
    {
        let text = py.import("json")?.call_method1("dumps", (context,))?;
        (EncodedFormat::Json, text_bytes(&text)?)
    } else if name == "DataFrame" && module.starts_with("polars") {
        let buffer = py.import("io")?.call_method0("BytesIO")?;
        context.call_method1("write_parquet", (&buffer,))?;
        let bytes = buffer.call_method0("getvalue")?;
        (
            EncodedFormat::Parquet,
            bytes.cast::<PyBytes>()?.as_bytes().to_vec(),
        )
    } else if name == "DataFrame" && module.starts_with("pandas") {
        let kwargs = PyDict::new(py);
        kwargs.set_item("index", false)?;
        let text = context.call_method("to_csv", (), Some(&kwargs))?;
        (EncodedFormat::Csv, text_bytes(&text)?)
    } else {
        return Err(PyTypeError::new_err(format!(
            "rlm_query() `context` must be a str, bytes, dict, list or a polars or pandas DataFrame in an isolated session, not {name}; pass str(x) to hand over its text"
        )));
    };
    let dir = std::env::var_os("SCRATCH").map_or_else(std::env::temp_dir, PathBuf::from);
    let n = ENCODED.fetch_add(1, Ordering::Relaxed);
    let file = dir.join(format!(
        "rlm-child-context-{}-{n}.{}",
        std::process::id(),
        format.extension()
    ));
    Ok(WireContext::Encoded(EncodedContext {
        source: file.to_string_lossy().into_owned(),
        format,
        bytes: Arc::new(bytes),
    }))
}

/// The UTF-8 bytes of `text`, a `str` a serialiser returned.
fn text_bytes(text: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    Ok(text.cast::<PyString>()?.to_cow()?.as_bytes().to_vec())
}

/// The note written once per session when `rlm_query` runs as `llm_query`.
const FLAT_NOTE: &str = "note: rlm_query() runs as llm_query() here: the run's depth limit \
                         allows no child runs at this depth (raise `--max-depth` for RLM \
                         children); the prompt and str(context) go to the sub-model\n";

fn say_flat_once(py: Python<'_>, slot: &ChildSlot) -> PyResult<()> {
    if !slot.said_flat.swap(true, Ordering::Relaxed) {
        py.import("sys")?
            .getattr("stderr")?
            .call_method1("write", (FLAT_NOTE,))?;
    }
    Ok(())
}

fn extract_text(value: &Bound<'_, PyAny>, what: impl FnOnce() -> String) -> PyResult<String> {
    match value.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{} must be a str, not {}",
            what(),
            value.get_type().name()?
        ))),
    }
}

fn extract_iterations(value: Option<&Bound<'_, PyAny>>, function: &str) -> PyResult<Option<u32>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => match v.extract::<u32>() {
            Ok(0) | Err(_) => Err(PyTypeError::new_err(format!(
                "{function}() `max_iterations` must be a positive int or None, got {}",
                v.repr()?
            ))),
            Ok(n) => Ok(Some(n)),
        },
    }
}

/// `context` as a child's context: the object itself, by reference (`None`: no context).
fn child_context(context: Option<&Bound<'_, PyAny>>) -> Option<ContextSource> {
    let context = context.filter(|c| !c.is_none())?;
    Some(ContextSource::Object(LiveObject::new(
        context.clone().unbind(),
        "context",
    )))
}

/// The prompt an `rlm_query` at the depth limit sends: the prompt, then `str(context)`.
fn flat_prompt(prompt: String, context: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    match context.filter(|c| !c.is_none()) {
        None => Ok(prompt),
        Some(context) => Ok(format!("{prompt}\n\n{}", context.str()?.to_cow()?)),
    }
}

/// Runs one child per prompt (with the context at the same position) where someone runs
/// them; `None` when nobody does (`rlm_query` is then `llm_query`).
fn run_children(
    py: Python<'_>,
    bridge: &SubModelBridge,
    slot: &ChildSlot,
    prompts: Vec<String>,
    contexts: &[Option<Bound<'_, PyAny>>],
    model: Option<String>,
    max_iterations: Option<u32>,
) -> PyResult<Option<Vec<SubAnswer>>> {
    let cancel = bridge.current_cell_token();
    match runner(bridge, slot) {
        Runner::Flat => Ok(None),
        Runner::Here(runner) => {
            let queries: Vec<ChildQuery> = prompts
                .into_iter()
                .zip(contexts)
                .map(|(prompt, context)| ChildQuery {
                    prompt,
                    context: child_context(context.as_ref()),
                    model: model.clone(),
                    max_iterations,
                })
                .collect();
            let n = queries.len();
            let mut answers = Vec::new();
            py.detach(|| runner.run(queries, &cancel, &mut |given| answers = given));
            Ok(bridge.children_answered(Some(answers), n))
        }
        Runner::Parent(remote) => {
            let mut children = Vec::with_capacity(prompts.len());
            for (prompt, context) in prompts.into_iter().zip(contexts) {
                let context = context
                    .as_ref()
                    .filter(|c| !c.is_none())
                    .map(|c| wire_context(py, c))
                    .transpose()?;
                children.push(WireChild {
                    prompt,
                    context,
                    model: model.clone(),
                    max_iterations,
                });
            }
            let n = children.len();
            let answers = py.detach(|| remote.children(children, &cancel));
            Ok(bridge.children_answered(answers, n))
        }
    }
}

/// `rlm_query(prompt, context=None, *, model=None, max_iterations=None) -> str`: ask a child
/// RLM, which works on `context` in a REPL of its own, and get its final answer.
#[pyclass(frozen, name = "rlm_query", module = "rlm")]
#[derive(Debug)]
pub(crate) struct RlmQuery {
    pub(crate) bridge: Arc<SubModelBridge>,
    pub(crate) slot: Arc<ChildSlot>,
}

#[pymethods]
impl RlmQuery {
    #[pyo3(signature = (prompt, context=None, *, model=None, max_iterations=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        context: Option<&Bound<'_, PyAny>>,
        model: Option<&Bound<'_, PyAny>>,
        max_iterations: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        self.bridge.refuse_in_forked_child(py, "rlm_query")?;
        let prompt = extract_text(prompt, || "rlm_query() `prompt`".to_owned())?;
        let max_iterations = extract_iterations(max_iterations, "rlm_query")?;
        let endpoint = super::natives::extract_model(model, "rlm_query")?;
        let contexts = [context.cloned()];
        let answers = run_children(
            py,
            &self.bridge,
            &self.slot,
            vec![prompt.clone()],
            &contexts,
            endpoint,
            max_iterations,
        )?;
        // `None`: nobody runs children here; otherwise the one child's answer (there is one
        // for each child).
        match answers.and_then(|answers| answers.into_iter().next()) {
            None => {
                say_flat_once(py, &self.slot)?;
                let prompt = PyString::new(py, &flat_prompt(prompt, context)?);
                let flat = LlmQuery {
                    bridge: Arc::clone(&self.bridge),
                };
                flat.__call__(py, prompt.as_any(), model)
            }
            Some(Ok(answer)) => Ok(answer),
            Some(Err(failure)) => self.bridge.failure(py, &failure),
        }
    }

    fn __repr__(&self) -> String {
        "<native function rlm_query(prompt, context=None, *, model=None, max_iterations=None) -> str>"
            .to_owned()
    }
}

/// `rlm_query_batched(prompts, contexts=None, *, model=None, max_iterations=None) ->
/// list[str]`: many children at once (within the run's fan-out width), answers in input
/// order; `contexts`, when given, has one object per prompt.
#[pyclass(frozen, name = "rlm_query_batched", module = "rlm")]
#[derive(Debug)]
pub(crate) struct RlmQueryBatched {
    pub(crate) bridge: Arc<SubModelBridge>,
    pub(crate) slot: Arc<ChildSlot>,
}

#[pymethods]
impl RlmQueryBatched {
    #[pyo3(signature = (prompts, contexts=None, *, model=None, max_iterations=None))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        contexts: Option<&Bound<'py, PyAny>>,
        model: Option<&Bound<'py, PyAny>>,
        max_iterations: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.bridge
            .refuse_in_forked_child(py, "rlm_query_batched")?;
        if prompts.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "rlm_query_batched() `prompts` must be a list of str, not a single str; use rlm_query() for one prompt",
            ));
        }
        let mut texts = Vec::new();
        for (i, item) in prompts.try_iter()?.enumerate() {
            texts.push(extract_text(&item?, || {
                format!("rlm_query_batched() `prompts[{i}]`")
            })?);
        }
        let objects: Vec<Option<Bound<'py, PyAny>>> = match contexts.filter(|c| !c.is_none()) {
            None => vec![None; texts.len()],
            Some(contexts) => {
                if contexts.is_instance_of::<PyString>() {
                    return Err(PyTypeError::new_err(
                        "rlm_query_batched() `contexts` must be a list with one object per prompt, not a single str",
                    ));
                }
                let objects: Vec<Option<Bound<'py, PyAny>>> = contexts
                    .try_iter()?
                    .map(|item| item.map(Some))
                    .collect::<PyResult<_>>()?;
                if objects.len() != texts.len() {
                    return Err(PyTypeError::new_err(format!(
                        "rlm_query_batched() got {} prompts but {} contexts; pass one context per prompt (or None)",
                        texts.len(),
                        objects.len()
                    )));
                }
                objects
            }
        };
        let max_iterations = extract_iterations(max_iterations, "rlm_query_batched")?;
        if texts.is_empty() {
            return Ok(PyList::empty(py));
        }
        let endpoint = super::natives::extract_model(model, "rlm_query_batched")?;
        match run_children(
            py,
            &self.bridge,
            &self.slot,
            texts.clone(),
            &objects,
            endpoint,
            max_iterations,
        )? {
            Some(answers) => self.bridge.child_answers(py, answers),
            None => {
                say_flat_once(py, &self.slot)?;
                let flat: Vec<String> = texts
                    .into_iter()
                    .zip(&objects)
                    .map(|(prompt, context)| flat_prompt(prompt, context.as_ref()))
                    .collect::<PyResult<_>>()?;
                let batched = LlmQueryBatched {
                    bridge: Arc::clone(&self.bridge),
                };
                batched.__call__(py, PyList::new(py, flat)?.as_any(), model)
            }
        }
    }

    fn __repr__(&self) -> String {
        "<native function rlm_query_batched(prompts, contexts=None, *, model=None, max_iterations=None) -> list[str]>"
            .to_owned()
    }
}
