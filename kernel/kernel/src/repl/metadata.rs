//! Data the session reports: what a context is ([`ContextMetadata`]), what a block did
//! ([`ExecutionResult`]) and what the namespace holds ([`VariableInfo`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use bridge::{Redactor, SubCallMetadata};

/// What kind of Python object a context became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextKind {
    /// `str`: text files, `-` (stdin), in-memory text.
    Text,
    /// `dict` or `list` (or a JSON scalar): `.json`.
    Json,
    /// `list` of parsed lines: `.jsonl`.
    JsonLines,
    /// `polars.DataFrame`: `.csv`, `.tsv`, `.parquet`, `.arrow`, `.ipc`, `.feather`, `.ndjson`.
    Table,
    /// `dict` of relative path → text: a directory.
    Directory,
}

impl ContextKind {
    /// The Python type a model sees, e.g. `polars.DataFrame`.
    pub fn python_type(self) -> &'static str {
        match self {
            Self::Text => "str",
            Self::Json => "dict | list",
            Self::JsonLines => "list",
            Self::Table => "polars.DataFrame",
            Self::Directory => "dict[str, str]",
        }
    }
}

/// Size statistics of a context's items, in characters (file text for directories, JSON
/// source text for JSON arrays/objects and JSON lines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemSizes {
    /// Smallest item.
    pub min: u64,
    /// Largest item.
    pub max: u64,
    /// Mean item size.
    pub mean: f64,
    /// Median item size.
    pub median: u64,
    /// Sum of all item sizes.
    pub total: u64,
}

impl ItemSizes {
    /// Statistics of `sizes`; `None` when empty.
    pub fn from_sizes(mut sizes: Vec<u64>) -> Option<Self> {
        if sizes.is_empty() {
            return None;
        }
        sizes.sort_unstable();
        let total: u64 = sizes.iter().sum();
        Some(Self {
            min: sizes[0],
            max: sizes[sizes.len() - 1],
            mean: total as f64 / sizes.len() as f64,
            median: sizes[sizes.len() / 2],
            total,
        })
    }
}

/// One loaded context, described at load time (for the prompt and the trajectory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextMetadata {
    /// Position among the session's contexts.
    pub index: usize,
    /// The variable holding it: `context_0`, `context_1`, … (`context` is `context_0`).
    pub name: String,
    /// What it became in Python.
    pub kind: ContextKind,
    /// Where it came from: a path, `-` for stdin, or `<text>`.
    pub source: String,
    /// Size of the source in bytes (sum of files for a directory).
    pub bytes: u64,
    /// Characters of text (text, JSON source, directory files); `None` for tables.
    pub chars: Option<u64>,
    /// Rows of a table.
    pub rows: Option<u64>,
    /// Columns of a table with their dtypes, e.g. `("price", "Float64")`.
    pub columns: Option<Vec<(String, String)>>,
    /// Number of items: files of a directory, elements/keys of JSON, lines of JSON lines.
    pub items: Option<u64>,
    /// Size statistics of the items.
    pub item_sizes: Option<ItemSizes>,
    /// Wall-clock time spent loading, in milliseconds.
    pub load_ms: f64,
}

impl ContextMetadata {
    /// One line for a prompt, e.g. ``context_0 (polars.DataFrame from `a.csv`): 1200 rows, 3 columns``.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(rows) = self.rows {
            parts.push(format!("{rows} rows"));
        }
        if let Some(columns) = &self.columns {
            let cols: Vec<String> = columns.iter().map(|(n, t)| format!("{n}: {t}")).collect();
            parts.push(format!("columns [{}]", cols.join(", ")));
        }
        if let Some(items) = self.items {
            parts.push(format!("{items} items"));
        }
        if let Some(chars) = self.chars {
            parts.push(format!("{chars} characters"));
        }
        parts.push(format!("{} bytes", self.bytes));
        format!(
            "{} ({} from `{}`): {}",
            self.name,
            self.kind.python_type(),
            self.source,
            parts.join(", ")
        )
    }
}

/// A user variable in the session's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableInfo {
    /// The name.
    pub name: String,
    /// `type(value).__name__`.
    pub type_name: String,
    /// `len(value)` for builtin containers, strings and polars objects.
    pub size: Option<usize>,
    /// A short, bounded preview (never the whole value).
    pub preview: String,
}

impl VariableInfo {
    /// Replaces every secret `redactor` knows in the preview.
    pub fn redact(&mut self, redactor: &Redactor) {
        redactor.redact_in_place(&mut self.preview);
    }
}

/// Where a final answer recorded by a block came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalSource {
    /// `answer["ready"]` became truthy.
    AnswerDict,
    /// `FINAL_VAR(x)` was called in code.
    FinalVar,
}

/// A final answer recorded while a block ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalAnswer {
    /// The answer text.
    pub value: String,
    /// How it was given.
    pub source: FinalSource,
}

/// A Python exception that ended a block (also: a timeout or cancellation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecError {
    /// Exception class name, e.g. `ZeroDivisionError`, `CellTimeout`.
    pub type_name: String,
    /// `str(exception)`.
    pub message: String,
    /// The formatted traceback of the user's code (kernel frames removed).
    pub traceback: String,
    /// The line of the block where it happened, when it happened in the block itself.
    pub line: Option<u32>,
}

/// What one sub-call was asked and what it answered, each cut to its head and tail
/// ([`SessionConfig::sub_call_text_chars`](super::SessionConfig::sub_call_text_chars)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubCallText {
    /// The prompt.
    pub prompt: String,
    /// The reply, or the `Error: ...` the code received.
    pub reply: String,
}

/// `text` if it has at most `limit` characters, else its head and tail around a marker that
/// says how much was left out.
pub(crate) fn head_and_tail(text: &str, limit: usize) -> String {
    let total = text.chars().count();
    if total <= limit {
        return text.to_owned();
    }
    let head: String = text.chars().take(limit - limit / 2).collect();
    let tail: String = text.chars().skip(total - limit / 2).collect();
    format!("{head}…[{} characters]…{tail}", total - limit)
}

/// Everything one executed block produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionResult {
    /// Captured standard output (head and tail kept, with a marker where text was dropped).
    pub stdout: String,
    /// Captured standard error, including the traceback of an exception.
    pub stderr: String,
    /// Characters of stdout dropped from the middle.
    pub stdout_omitted_chars: usize,
    /// Characters of stderr dropped from the middle.
    pub stderr_omitted_chars: usize,
    /// The exception that ended the block, if any.
    pub error: Option<ExecError>,
    /// The block was stopped by its time limit.
    pub timed_out: bool,
    /// Wall-clock time of the block.
    pub duration: Duration,
    /// Sub-model calls recorded by the ledger while the block ran.
    pub sub_calls: Vec<SubCallMetadata>,
    /// What the block's `llm_query`/`llm_query_batched` calls asked and received, in the order
    /// the code got the replies (a batch in input order); empty when the session keeps none.
    #[serde(default)]
    pub sub_call_texts: Vec<SubCallText>,
    /// Calls of `llm_query` during the block.
    pub llm_query_calls: u32,
    /// Calls of `llm_query_batched` during the block.
    pub llm_query_batched_calls: u32,
    /// Final answers recorded during the block, at most one per convention, in the order
    /// first recorded: the `answer` dict's content at the moment `ready` turned true, and the
    /// value of the last `FINAL_VAR` call.
    pub final_answers: Vec<FinalAnswer>,
    /// The user's variables after the block.
    pub variables: Vec<VariableInfo>,
    /// Names the block created.
    pub new_variables: Vec<String>,
}

impl ExecutionResult {
    /// The block ended without an exception or timeout.
    pub fn is_success(&self) -> bool {
        self.error.is_none() && !self.timed_out
    }

    /// The first final answer the block recorded, whatever its convention.
    pub fn final_answer(&self) -> Option<&FinalAnswer> {
        self.final_answers.first()
    }

    /// Replaces every secret `redactor` knows in the result's text: output, exception,
    /// final answers, variable previews, sub-call errors and texts.
    pub fn redact(&mut self, redactor: &Redactor) {
        if redactor.is_empty() {
            return;
        }
        redactor.redact_in_place(&mut self.stdout);
        redactor.redact_in_place(&mut self.stderr);
        if let Some(error) = &mut self.error {
            redactor.redact_in_place(&mut error.message);
            redactor.redact_in_place(&mut error.traceback);
        }
        for answer in &mut self.final_answers {
            redactor.redact_in_place(&mut answer.value);
        }
        for variable in &mut self.variables {
            variable.redact(redactor);
        }
        for call in &mut self.sub_calls {
            if let Some(error) = &mut call.error {
                redactor.redact_in_place(error);
            }
        }
        for text in &mut self.sub_call_texts {
            redactor.redact_in_place(&mut text.prompt);
            redactor.redact_in_place(&mut text.reply);
        }
    }
}
