//! The tools an agent may call, by name, each with its compiled JSON-Schema validator.
//!
//! A tool's schema is compiled once, when it is added: a tool whose schema does not compile
//! (not a JSON Schema, a `pattern` that is no regular expression, a `$ref` to a document
//! outside it) is refused then, so a model's call can only fail on its own arguments.
//! Validation is `boon`'s (drafts 4 to 2020-12, 2020-12 unless the schema says otherwise;
//! `format` annotates, as the 2020-12 draft says): a small validator, for schemas that are
//! small documents, that builds in seconds where the larger `jsonschema` took a sixth of a
//! release build's CPU. Its loader is replaced by one that loads nothing: no file or URL is
//! read, whatever a `$ref` names.

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
    validator: Validator,
}

/// A tool's parameters compiled: the compiled schema set and its root.
struct Validator {
    schemas: boon::Schemas,
    root: boon::SchemaIndex,
}

/// Where a tool's parameters are placed for the compiler: every `$ref` resolves against it
/// (a relative one to a URL under it, which [`LoadNothing`] refuses). `.invalid` names no
/// host; nothing is fetched from it either way.
const SCHEMA_URL: &str = "https://tool.rlm.invalid/parameters.json";

impl Validator {
    /// Compiles `schema`, checking it against its draft's metaschema first.
    fn compile(schema: &Value) -> Result<Self, String> {
        let mut compiler = boon::Compiler::new();
        compiler.use_loader(Box::new(LoadNothing));
        let mut schemas = boon::Schemas::new();
        // The alternate form says why (which keyword, which regex), not only where.
        let why = |e: boon::CompileError| format!("{e:#}");
        compiler
            .add_resource(SCHEMA_URL, schema.clone())
            .map_err(why)?;
        let root = compiler.compile(SCHEMA_URL, &mut schemas).map_err(why)?;
        Ok(Self { schemas, root })
    }

    /// At most `limit` problems of `args`, each with the JSON Pointer of the value it
    /// concerns (none for the whole object).
    fn problems(&self, args: &Value, limit: usize) -> Vec<String> {
        let Err(error) = self.schemas.validate(args, self.root) else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        leaves(&error, &mut |leaf| {
            if problems.len() < limit {
                problems.push(match leaf.instance_location.to_string().as_str() {
                    "" => leaf.kind.to_string(),
                    at => format!("`{at}`: {}", leaf.kind),
                });
            }
        });
        problems
    }
}

/// The errors of `error`'s tree that have no causes: what is wrong, not where the
/// validator looked (`allOf`, `$ref`, …).
fn leaves<'e>(
    error: &'e boon::ValidationError<'_, '_>,
    found: &mut impl FnMut(&'e boon::ValidationError<'_, '_>),
) {
    if error.causes.is_empty() {
        found(error);
    }
    for cause in &error.causes {
        leaves(cause, found);
    }
}

/// The compiler's loader: a schema that refers outside itself is refused, never fetched.
struct LoadNothing;

impl boon::UrlLoader for LoadNothing {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!(
            "`{url}` is outside the tool's parameters; tool schemas must be self-contained \
             (put shared definitions under `$defs` and refer to them as `#/$defs/NAME`)"
        )
        .into())
    }
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
        let validator = Validator::compile(&definition.parameters).map_err(|detail| {
            ToolboxError::InvalidSchema {
                tool: name.clone(),
                detail,
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
        let problems = entry.validator.problems(&args, MAX_SCHEMA_PROBLEMS);
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
