//! The `python` tool: code run in the agent's REPL session.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use engine::{Tool, ToolContext, ToolError};
use serde_json::{Value, json};

use super::{CALL_SLACK, block_failure, on_session};
use crate::repl::ReplSession;

/// Runs Python code in a [`ReplSession`] (see the [module docs](super)); the tool's name is
/// `python` and it takes `{"code": "..."}`.
#[derive(Debug)]
pub struct PythonTool {
    session: Arc<ReplSession>,
    description: String,
}

impl PythonTool {
    /// The `python` tool over `session`; its description names the session's contexts.
    pub fn new(session: Arc<ReplSession>) -> Self {
        let mut description = String::from(
            "Run Python code in a persistent session: variables, imports and functions stay \
             for later calls. Returns what the code prints (stdout, stderr); a final bare \
             expression is shown like in a notebook. `llm_query(prompt)` and \
             `llm_query_batched(prompts)` ask a sub-model and return its answers as strings.",
        );
        let names: Vec<String> = session
            .contexts()
            .iter()
            .map(|c| format!("`{}`", c.name))
            .collect();
        if !names.is_empty() {
            description.push_str(&format!(
                " Loaded data is in the variables `context` (the first) and {}.",
                names.join(", ")
            ));
        }
        Self {
            session,
            description,
        }
    }
}

#[async_trait]
impl Tool for PythonTool {
    fn name(&self) -> &str {
        "python"
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code to run."}
            },
            "required": ["code"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let code = match args.get("code") {
            Some(Value::String(code)) => code.clone(),
            _ => {
                return Err(ToolError::InvalidArguments(
                    "`code` must be a string of Python code".to_owned(),
                ));
            }
        };
        let result = on_session(&self.session, ctx.cancel(), move |session, stop| {
            session.exec_until_stopped(&code, stop)
        })
        .await?
        .map_err(|e| ToolError::Failed(format!("The Python session failed: {e}")))?;
        if !result.is_success() {
            return Err(block_failure(&result, ctx.cancel(), &self.session));
        }
        Ok(json!({"stdout": result.stdout, "stderr": result.stderr}))
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.session.config().cell_timeout + CALL_SLACK)
    }

    fn when_cut(&self) -> Option<&str> {
        Some(
            "Print less at once: keep the value in a variable and print a slice of it \
             (`text[:5000]`), its `len()` or a summary",
        )
    }
}
