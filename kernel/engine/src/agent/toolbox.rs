//! The tools an agent may call, by name, each with its compiled JSON-Schema validator.
//!
//! A tool's schema is compiled once, when it is added: a tool whose schema does not compile
//! is refused then, so a model's call can only fail on its own arguments. Validation resolves
//! no external `$ref` (no HTTP, no files: `jsonschema` is built without them).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bridge::{ToolCall, ToolDefinition};
use serde_json::Value;

use super::failure::ToolCallError;
use crate::tool::Tool;

/// Problems reported for one call's arguments, at most.
const MAX_SCHEMA_PROBLEMS: usize = 5;

/// Why a tool could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolboxError {
    /// Another tool has the name already.
    #[error("Two tools are named `{0}`; tool names must be unique within an agent")]
    DuplicateName(String),
    /// The name is not what the providers accept.
    #[error("The tool name `{0}` is not allowed; use 1 to 64 ASCII letters, digits, `_` or `-`")]
    InvalidName(String),
    /// The parameters are not a usable JSON Schema.
    #[error("The parameters of tool `{tool}` are not a valid JSON Schema: {detail}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// What the schema compiler said.
        detail: String,
    },
}

struct Entry {
    tool: Arc<dyn Tool>,
    definition: ToolDefinition,
    validator: jsonschema::Validator,
}

/// Tools by name, in the order they were added.
#[derive(Default)]
pub struct Toolbox {
    entries: Vec<Entry>,
    by_name: BTreeMap<String, usize>,
}

impl fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolbox")
            .field("tools", &self.names())
            .finish()
    }
}

impl Toolbox {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`; refuses a second tool of the same name, a name the providers would
    /// reject, and parameters that are not a JSON Schema.
    pub fn add(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolboxError> {
        let definition = tool.definition();
        let name = definition.name.clone();
        if !bridge::chat::is_valid_tool_name(&name) {
            return Err(ToolboxError::InvalidName(name));
        }
        if self.by_name.contains_key(&name) {
            return Err(ToolboxError::DuplicateName(name));
        }
        let validator = jsonschema::validator_for(&definition.parameters).map_err(|e| {
            ToolboxError::InvalidSchema {
                tool: name.clone(),
                detail: e.to_string(),
            }
        })?;
        self.by_name.insert(name, self.entries.len());
        self.entries.push(Entry {
            tool,
            definition,
            validator,
        });
        Ok(())
    }

    /// [`add`](Self::add) in builder style.
    pub fn with(mut self, tool: Arc<dyn Tool>) -> Result<Self, ToolboxError> {
        self.add(tool)?;
        Ok(self)
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&i| &self.entries[i].tool)
    }

    /// The tool names, in the order they were added.
    pub fn names(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| e.definition.name.clone())
            .collect()
    }

    /// The definitions sent to the model, in the order the tools were added.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.entries.iter().map(|e| e.definition.clone()).collect()
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tool `call` names and its arguments, parsed and checked against the schema.
    pub fn prepare(&self, call: &ToolCall) -> Result<(Arc<dyn Tool>, Value), ToolCallError> {
        let Some(&index) = self.by_name.get(&call.name) else {
            return Err(ToolCallError::UnknownTool {
                name: call.name.clone(),
                known: self.names(),
            });
        };
        let entry = &self.entries[index];
        let args = parse_arguments(&call.name, &call.arguments)?;
        let problems: Vec<String> = entry
            .validator
            .iter_errors(&args)
            .take(MAX_SCHEMA_PROBLEMS)
            .map(|e| {
                // A problem of the whole object needs no pointer.
                match e.instance_path().as_str() {
                    "" => e.to_string(),
                    at => format!("`{at}`: {e}"),
                }
            })
            .collect();
        if !problems.is_empty() {
            return Err(ToolCallError::SchemaMismatch {
                tool: call.name.clone(),
                problems,
            });
        }
        Ok((Arc::clone(&entry.tool), args))
    }
}

/// The arguments as a JSON object; empty text (some models send it for tools without
/// parameters) counts as `{}`.
fn parse_arguments(tool: &str, text: &str) -> Result<Value, ToolCallError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(other) => Err(ToolCallError::MalformedArguments {
            tool: tool.to_owned(),
            detail: format!("got {}, not an object", json_type(&other)),
        }),
        Err(e) => Err(ToolCallError::MalformedArguments {
            tool: tool.to_owned(),
            detail: e.to_string(),
        }),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
