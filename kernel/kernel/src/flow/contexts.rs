//! [`ContextLoader`]: the step that loads the run's contexts into its REPL session and
//! writes their metadata (kind, size, rows, columns — never the data) to the state.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use engine::flow::{Agent, Callbacks, Control, Event, EventKind, FlowError, InvocationContext};
use serde_json::Value;

use super::services::{FlowKernel, off_runtime};
use crate::repl::{ContextInput, ContextSource, ReplError};

/// Loads the run's contexts (its `--context` paths, then the paths listed in state key
/// `paths_key`: a list of paths, or a dict of name to path) into the session and writes
/// their metadata to `output_key` (default `contexts`).
pub struct ContextLoader {
    name: String,
    paths_key: Option<String>,
    output_key: String,
    kernel: Arc<FlowKernel>,
    callbacks: Callbacks,
}

impl std::fmt::Debug for ContextLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContextLoader({})", self.name)
    }
}

/// The state key context metadata goes to unless another is named.
pub const CONTEXTS_KEY: &str = "contexts";

impl ContextLoader {
    /// The loader `name` over `kernel`.
    pub fn new(name: impl Into<String>, kernel: Arc<FlowKernel>) -> Self {
        Self {
            name: name.into(),
            paths_key: None,
            output_key: CONTEXTS_KEY.to_owned(),
            kernel,
            callbacks: Callbacks::new(),
        }
    }

    /// Also loads the paths in state key `key`.
    pub fn with_paths_key(mut self, key: impl Into<String>) -> Self {
        self.paths_key = Some(key.into());
        self
    }

    /// Writes the metadata to state key `key`.
    pub fn with_output_key(mut self, key: impl Into<String>) -> Self {
        self.output_key = key.into();
        self
    }

    /// This step with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    fn fail(&self, message: impl Into<String>) -> FlowError {
        FlowError::Agent {
            agent: self.name.clone(),
            message: message.into(),
        }
    }

    /// A failure loading again cannot mend (a bad path or file in the state).
    fn misset(&self, message: impl Into<String>) -> FlowError {
        FlowError::Setup {
            agent: self.name.clone(),
            message: message.into(),
        }
    }

    /// The load failure `error` as a flow error: a context file or name that is wrong is
    /// permanent, a broken session is the agent's own (maybe passing) failure.
    fn load_error(&self, error: &ReplError) -> FlowError {
        let message = format!("Cannot load the contexts: {error}");
        match error {
            ReplError::MissingPackage { .. }
            | ReplError::ContextRead { .. }
            | ReplError::ContextNotUtf8 { .. }
            | ReplError::ContextMalformed { .. }
            | ReplError::ContextBinary { .. }
            | ReplError::ContextBadRow { .. }
            | ReplError::UnknownEncoding { .. }
            | ReplError::ContextType { .. }
            | ReplError::ContextName { .. } => self.misset(message),
            _ => self.fail(message),
        }
    }

    /// The contexts named in the state.
    fn named(&self, ctx: &InvocationContext) -> Result<Vec<ContextInput>, FlowError> {
        let Some(key) = &self.paths_key else {
            return Ok(Vec::new());
        };
        let path = |value: &Value| {
            value
                .as_str()
                .map(|p| ContextSource::Path(PathBuf::from(p)))
                .ok_or_else(|| {
                    self.misset(format!(
                        "State key `{key}` must hold paths (strings), not `{value}`"
                    ))
                })
        };
        match ctx.get_state(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(p)) => Ok(vec![ContextSource::Path(PathBuf::from(p)).into()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| path(v).map(ContextInput::from))
                .collect(),
            Some(Value::Object(named)) => named
                .iter()
                .map(|(name, v)| {
                    Ok(ContextInput {
                        name: Some(name.clone()),
                        source: path(v)?,
                    })
                })
                .collect(),
            Some(other) => Err(self.misset(format!(
                "State key `{key}` must hold a path, a list of paths or a dict of name to path, \
                 not `{other}`"
            ))),
        }
    }
}

#[async_trait]
impl Agent for ContextLoader {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "Loads the contexts into the Python session"
    }

    fn class(&self) -> &str {
        "ContextLoader"
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let more = self.named(ctx)?;
        let kernel = Arc::clone(&self.kernel);
        let session = off_runtime(
            ctx,
            &self.name,
            move || {
                if more.is_empty() {
                    kernel.session()
                } else {
                    kernel.load_contexts(&more)
                }
            },
            None,
        )
        .await?
        .map_err(|e| self.load_error(&e))?;
        let metadata = serde_json::to_value(session.contexts())
            .map_err(|e| self.fail(format!("Cannot record the contexts' metadata: {e}")))?;
        ctx.set_state(self.output_key.clone(), metadata);
        ctx.emit(Event::new(EventKind::StateUpdate))?;
        Ok(Control::Continue)
    }
}
