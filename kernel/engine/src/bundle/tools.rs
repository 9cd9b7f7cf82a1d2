//! The file tools of a bundle agent: `read_file`, `execute_workflow` and `save_output`, and
//! `load_workflow_file` for a workflow agent playing a persona (it reads only the bundle's
//! own folder).
//!
//! Their parameters are the agent-bundle specification's, by name: `read_file(file_path)`,
//! `execute_workflow(workflow_path, user_input?)`, `save_output(file_path, content)` (and
//! `load_workflow_file(file_path)`), so a model or a prompt written for that specification
//! calls them as it expects; a wrong name fails the schema check with both names in the
//! error. Each resolves the variables in the paths it gets (an unknown one is an error
//! listing those available), goes through the session's sandbox, and turns every failure
//! into a [`ToolError`] the model reads and can act on.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::error::{BundleError, PathError, VariableError};
use super::sandbox::Sandbox;
use super::session::BundleSession;
use super::vars::template_values;
use super::workflow::load_workflow;
use crate::tool::{Tool, ToolContext, ToolError};

/// The note for a file cut in a tool result: files are returned whole or not at all.
const FILE_CUT: &str = "The file is returned whole or not at all: work from its head and \
                        tail, or ask the user for the part you need";

/// `read_file`: the text of one file of the bundle or the project.
#[derive(Debug, Clone)]
pub struct ReadFile {
    session: Arc<BundleSession>,
}

/// `execute_workflow`: a `workflow.yaml` with its variables, instructions, template and data.
#[derive(Debug, Clone)]
pub(crate) struct ExecuteWorkflow {
    session: Arc<BundleSession>,
}

/// `save_output`: writes a document under the output folder.
#[derive(Debug, Clone)]
pub(crate) struct SaveOutput {
    session: Arc<BundleSession>,
}

/// `load_workflow_file`: one file of the bundle's own folder (a workflow, its instructions,
/// its template), relative to that folder.
#[derive(Debug, Clone)]
pub(crate) struct LoadWorkflowFile {
    session: Arc<BundleSession>,
    bundle: Sandbox,
}

impl LoadWorkflowFile {
    /// The tool over `session`, reading only under its bundle root.
    pub(crate) fn new(session: Arc<BundleSession>) -> Result<Self, PathError> {
        let root = session.roots().bundle.clone();
        let bundle = Sandbox::new(std::slice::from_ref(&root), &root, &root)?
            .with_max_bytes(session.sandbox().max_bytes())
            .with_policy(session.sandbox().policy())
            .with_log(session.file_log().clone());
        Ok(Self { session, bundle })
    }
}

#[async_trait]
impl Tool for LoadWorkflowFile {
    fn name(&self) -> &str {
        "load_workflow_file"
    }

    fn description(&self) -> &str {
        "Load one file of your agent bundle (a `workflow.yaml`, its instructions or its \
         template) and return its text. Paths are relative to the bundle folder or start with \
         `{bundle-root}`; files outside the bundle are refused."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "The file, e.g. `workflows/plan/workflow.yaml`."}
            },
            "required": ["file_path"],
            "additionalProperties": false
        })
    }

    fn when_cut(&self) -> Option<&str> {
        Some(FILE_CUT)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let (path, content) = read_named(&self.session, &self.bundle, &args, self.name())?;
        let shown = path
            .strip_prefix(&self.session.roots().bundle)
            .unwrap_or(&path)
            .display()
            .to_string();
        Ok(json!({"path": shown, "content": content}))
    }
}

impl ReadFile {
    /// The tool over `session`.
    pub(crate) fn new(session: Arc<BundleSession>) -> Self {
        Self { session }
    }
}

impl ExecuteWorkflow {
    /// The tool over `session`.
    pub(crate) fn new(session: Arc<BundleSession>) -> Self {
        Self { session }
    }
}

impl SaveOutput {
    /// The tool over `session`.
    pub(crate) fn new(session: Arc<BundleSession>) -> Self {
        Self { session }
    }
}

/// The three file tools over `session`.
pub(crate) fn file_tools(session: &Arc<BundleSession>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile::new(Arc::clone(session))),
        Arc::new(ExecuteWorkflow::new(Arc::clone(session))),
        Arc::new(SaveOutput::new(Arc::clone(session))),
    ]
}

fn string_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArguments(format!("`{name}` must be a string")))
}

fn failed(err: impl Into<BundleError>) -> ToolError {
    ToolError::Failed(err.into().to_string())
}

/// The file `args.file_path` names (its variables resolved), read through `sandbox`.
fn read_named(
    session: &BundleSession,
    sandbox: &Sandbox,
    args: &Value,
    by: &str,
) -> Result<(std::path::PathBuf, String), ToolError> {
    let path = session
        .variables()
        .resolve(string_arg(args, "file_path")?)
        .map_err(failed)?;
    sandbox.read_text(&path, by).map_err(failed)
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Load one text file of the agent bundle, the project or a skill and return its \
         content. Paths may use variables such as `{project-root}`. A relative path names a \
         file of the skill you loaded last that has it (`references/guide.md`), else of the \
         project root."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "The file to read, e.g. `{project-root}/docs/brief.md`."}
            },
            "required": ["file_path"],
            "additionalProperties": false
        })
    }

    fn when_cut(&self) -> Option<&str> {
        Some(FILE_CUT)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let session = &self.session;
        let path = session
            .variables()
            .resolve(string_arg(&args, "file_path")?)
            .map_err(failed)?;
        let path = session.skill_relative(&path);
        let (path, content) = session
            .sandbox()
            .read_text(&path, self.name())
            .map_err(failed)?;
        let content = session
            .present(&path, content, self.name())
            .map_err(failed)?;
        Ok(json!({"path": path, "content": content}))
    }
}

#[async_trait]
impl Tool for ExecuteWorkflow {
    fn name(&self) -> &str {
        "execute_workflow"
    }

    fn description(&self) -> &str {
        "Load a workflow (`workflow.yaml`) with everything it needs: its resolved variables \
         (among them `default_output_file`), its instructions, its template and its data files. \
         Then run the instructions step by step. `user_input` passes values the user gave \
         (they fill the workflow's `{name}` variables; `data` names a data file to load)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "workflow_path": {"type": "string", "description": "The `workflow.yaml`, as the command names it."},
                "user_input": {"type": "object", "description": "Values the user gave, by name (e.g. `{\"project_name\": \"Onboarding\"}`); `data` names a data file the command passes along (its `data` handler)."}
            },
            "required": ["workflow_path"],
            "additionalProperties": false
        })
    }

    fn when_cut(&self) -> Option<&str> {
        Some(FILE_CUT)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let path = string_arg(&args, "workflow_path")?;
        let input = match args.get("user_input") {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(input)) => input.clone(),
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`user_input` must be an object of values by name".to_owned(),
                ));
            }
        };
        load_workflow(&self.session, path, &input, self.name()).map_err(failed)
    }
}

#[async_trait]
impl Tool for SaveOutput {
    fn name(&self) -> &str {
        "save_output"
    }

    fn description(&self) -> &str {
        "Write a document (usually the workflow's `default_output_file`) under the output \
         folder, creating the folders it needs. `content` is the whole document: it replaces \
         the file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "Where to write; variables such as `{output_folder}` are filled in."},
                "content": {"type": "string", "description": "The whole text of the document."}
            },
            "required": ["file_path", "content"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let written = string_arg(&args, "file_path")?;
        let content = string_arg(&args, "content")?;
        let path = self.session.variables().resolve(written).map_err(failed)?;
        if let Some(name) = template_values(&path).into_iter().next() {
            return Err(failed(VariableError::TemplateValue {
                name,
                text: written.to_owned(),
            }));
        }
        let path = self
            .session
            .sandbox()
            .write_text(&path, content, self.name())
            .map_err(failed)?;
        Ok(json!({"path": path, "bytes": content.len()}))
    }
}
