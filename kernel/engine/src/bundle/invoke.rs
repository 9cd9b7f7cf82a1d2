//! `invoke_agent`: one agent of a bundle asks another and gets its answer.
//!
//! The other agent starts as any agent does (its own start-up files, variables and prompts,
//! in the same project, recording into the same file log), gets the message as its user
//! turn, and runs its own function-calling loop with its own file tools on the same model.
//! Agents may call each other at most [`MAX_DEPTH`] levels deep, so two agents that keep
//! calling each other end.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bridge::{Endpoint, Message};
use serde_json::{Value, json};

use super::agent::AgentFormat;
use super::session::BundleSession;
use super::started::{StartOptions, StartedAgent};
use crate::agent::{AgentLoop, LoopConfig, Toolbox};
use crate::tool::{Tool, ToolContext, ToolError};

/// How deep agents may call agents (the user's agent is depth 0).
pub(crate) const MAX_DEPTH: u32 = 2;

/// The tools of a started agent: its file tools, its skill tools (scripts running through
/// `python` when the user allowed it) and, for a BMAD 6.0 agent, `invoke_agent`.
pub fn agent_tools(
    agent: &StartedAgent,
    endpoint: Arc<Endpoint>,
    config: LoopConfig,
    python: Option<Arc<dyn Tool>>,
) -> Vec<Arc<dyn Tool>> {
    let mut tools = agent.tools_with_python(python);
    if agent.definition.format == AgentFormat::AgentXml {
        tools.push(Arc::new(InvokeAgent::new(endpoint, config, &agent.session)));
    }
    tools
}

/// `invoke_agent`: asks another agent of the bundle (`agents/NAME.md`) and returns its answer.
#[derive(Debug, Clone)]
pub(crate) struct InvokeAgent {
    endpoint: Arc<Endpoint>,
    config: LoopConfig,
    options: StartOptions,
    agents: PathBuf,
    names: Vec<String>,
    description: String,
    depth: u32,
}

impl InvokeAgent {
    /// The tool for the agent whose tools share `session`, asking `endpoint` with `config`.
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        config: LoopConfig,
        session: &BundleSession,
    ) -> Self {
        let options = StartOptions {
            project_root: Some(session.roots().project.clone()),
            working_dir: None,
            policy: session.sandbox().policy(),
            max_file_bytes: Some(session.sandbox().max_bytes()),
            date: session.variables().value("date").and_then(Result::ok),
            file_log: Some(session.file_log().clone()),
            skill_folders: session.skills().folders().to_vec(),
        };
        Self::at_depth(
            endpoint,
            config,
            options,
            session.roots().bundle.join("agents"),
            0,
        )
    }

    fn at_depth(
        endpoint: Arc<Endpoint>,
        config: LoopConfig,
        options: StartOptions,
        agents: PathBuf,
        depth: u32,
    ) -> Self {
        let mut names: Vec<String> = std::fs::read_dir(&agents)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "md") && p.is_file())
                    .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let listed = if names.is_empty() {
            "none".to_owned()
        } else {
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let description = format!(
            "Ask another agent of this bundle and get its answer. It starts fresh, with its own \
             persona and tools, and sees only your message: say everything it needs. Agents: \
             {listed}."
        );
        Self {
            endpoint,
            config,
            options,
            agents,
            names,
            description,
            depth,
        }
    }
}

#[async_trait]
impl Tool for InvokeAgent {
    fn name(&self) -> &str {
        "invoke_agent"
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "description": "The agent's name (its file name without `.md`).", "enum": self.names},
                "message": {"type": "string", "description": "What to ask or tell it."}
            },
            "required": ["agent", "message"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .ok_or_else(|| ToolError::InvalidArguments(format!("`{key}` must be a string")))
        };
        let (name, message) = (text("agent")?, text("message")?);
        if !self.names.iter().any(|n| n == name) {
            return Err(ToolError::Failed(format!(
                "No agent `{name}` in `{}`; the agents are: {}",
                self.agents.display(),
                self.names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if self.depth >= MAX_DEPTH {
            return Err(ToolError::Failed(format!(
                "Agents may call agents only {MAX_DEPTH} levels deep; answer this yourself"
            )));
        }
        let started =
            StartedAgent::start(&self.agents.join(format!("{name}.md")), &self.options)
                .map_err(|e| ToolError::Failed(format!("Agent `{name}` could not start: {e}")))?;
        let mut toolbox = Toolbox::new();
        let nested = Self::at_depth(
            Arc::clone(&self.endpoint),
            self.config.clone(),
            self.options.clone(),
            self.agents.clone(),
            self.depth + 1,
        );
        let tools = started
            .tools()
            .into_iter()
            .chain([Arc::new(nested) as Arc<dyn Tool>]);
        for tool in tools {
            toolbox
                .add(tool)
                .map_err(|e| ToolError::Failed(format!("Agent `{name}` has bad tools: {e}")))?;
        }
        let mut messages = started.messages();
        messages.push(Message::user(message));
        let agent = AgentLoop::new(Arc::clone(&self.endpoint), toolbox, self.config.clone());
        match agent
            .run(messages, ctx.state().clone(), ctx.cancel().clone())
            .await
        {
            Ok(outcome) => Ok(json!({"agent": name, "answer": outcome.answer})),
            Err(e) => Err(ToolError::Failed(format!(
                "Agent `{name}` did not answer: {e}"
            ))),
        }
    }
}
