//! Data the session reports: what a context is ([`ContextMetadata`]), what a block did
//! ([`ExecutionResult`]) and what the namespace holds ([`VariableInfo`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use bridge::{Redactor, SubCallMetadata};

/// What kind of Python object a context became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextKind {
    /// `str`: text files, `-` (stdin), in-memory text.
    Text,
    /// `dict` or `list` (or a JSON scalar): `.json`.
    Json,
    /// `list` of parsed lines: `.jsonl`.
    JsonLines,
    /// A data frame: `.csv`, `.tsv`, `.parquet`, `.arrow`, `.ipc`, `.feather`, `.ndjson`, and
    /// Excel workbooks with one sheet.
    Table,
    /// `dict` of sheet name → data frame: an Excel workbook with several sheets.
    Workbook,
    /// `dict` of relative path → each file loaded as on its own: a directory.
    Directory,
}

impl ContextKind {
    /// The Python type a model sees, e.g. `polars.DataFrame`.
    pub fn python_type(self, frames: FrameLibrary) -> &'static str {
        match (self, frames) {
            (Self::Text, _) => "str",
            (Self::Json, _) => "dict | list",
            (Self::JsonLines, _) => "list",
            (Self::Table, FrameLibrary::Polars) => "polars.DataFrame",
            (Self::Table, FrameLibrary::Pandas) => "pandas.DataFrame",
            (Self::Workbook, FrameLibrary::Polars) => "dict[str, polars.DataFrame]",
            (Self::Workbook, FrameLibrary::Pandas) => "dict[str, pandas.DataFrame]",
            (Self::Directory, _) => "dict",
        }
    }
}

/// Which library's data frames tables become.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameLibrary {
    /// `polars.DataFrame` (tables are read by polars either way).
    #[default]
    Polars,
    /// `pandas.DataFrame`, converted from polars column by column through NumPy.
    Pandas,
}

/// A compression a context file was read through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// gzip (`.gz`), several members read as one stream like `zcat`.
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
}

impl Compression {
    /// `gzip`, `zstd`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }
}

/// A kind of file that cannot be a context, recognised by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryKind {
    /// A PNG image.
    Png,
    /// A JPEG image.
    Jpeg,
    /// A GIF image.
    Gif,
    /// A WebP image.
    Webp,
    /// A TIFF image.
    Tiff,
    /// PDF.
    Pdf,
    /// A zip archive that is not a spreadsheet.
    Zip,
    /// A tar archive.
    Tar,
    /// xz or bzip2 compression, which the kernel does not read.
    OtherCompression,
    /// A 7-Zip archive.
    SevenZip,
    /// An SQLite database.
    Sqlite,
    /// A legacy Office (OLE2) document that is not named `.xls`.
    LegacyOffice,
    /// An executable program or library.
    Executable,
    /// Audio or video.
    Media,
    /// UTF-16 text (byte-order mark) read without `--encoding`.
    Utf16,
    /// Anything else with NUL bytes.
    Other,
}

impl BinaryKind {
    /// What the file is, e.g. `a PNG image`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Png => "a PNG image",
            Self::Jpeg => "a JPEG image",
            Self::Gif => "a GIF image",
            Self::Webp => "a WebP image",
            Self::Tiff => "a TIFF image",
            Self::Pdf => "a PDF document",
            Self::Zip => "a zip archive",
            Self::Tar => "a tar archive",
            Self::OtherCompression => "xz- or bzip2-compressed data",
            Self::SevenZip => "a 7-Zip archive",
            Self::Sqlite => "an SQLite database",
            Self::LegacyOffice => "a legacy Office (OLE2) document",
            Self::Executable => "a program (executable or library)",
            Self::Media => "an audio or video file",
            Self::Utf16 => "UTF-16 text",
            Self::Other => "a binary file",
        }
    }

    /// What the user can do instead.
    pub fn advice(self) -> &'static str {
        match self {
            Self::Png | Self::Jpeg | Self::Gif | Self::Webp | Self::Tiff => {
                "a context is text, JSON or a table: transcribe or describe the image as text, or leave it out"
            }
            Self::Pdf => {
                "extract its text first (e.g. `pdftotext FILE.pdf FILE.txt`) and pass the text file"
            }
            Self::Zip => "unpack it (`unzip FILE -d DIR`) and pass the folder",
            Self::Tar => "unpack it (`tar xf FILE -C DIR`) and pass the folder",
            Self::OtherCompression => {
                "decompress it (`xz -d` or `bunzip2`), or recompress it with gzip or zstd, which load directly"
            }
            Self::SevenZip => "unpack it (`7z x FILE`) and pass the folder",
            Self::Sqlite => {
                "export the tables you need to CSV or Parquet (e.g. `sqlite3 -header -csv DB 'select * from t' > t.csv`)"
            }
            Self::LegacyOffice => {
                "if it is an Excel workbook, name it `.xls`; otherwise save it as text, CSV or `.xlsx`"
            }
            Self::Executable => "it is a program, not data: pass the files it works on",
            Self::Media => "pass a transcript as text instead",
            Self::Utf16 => "pass `--encoding utf-16`",
            Self::Other => {
                "contexts are text (UTF-8, or another encoding with `--encoding`), JSON, JSON lines, CSV/TSV, Parquet, Arrow or Excel, optionally gzip- or zstd-compressed: convert it to one of those"
            }
        }
    }
}

/// A file of a directory context that was left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Path relative to the directory.
    pub path: String,
    /// What it is.
    pub kind: BinaryKind,
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
    /// The variable holding it: its name (`-c sales=…`), else `context_N` (`context` is
    /// `context_0`; every context is `context_N` too).
    pub name: String,
    /// What it became in Python.
    pub kind: ContextKind,
    /// Where it came from: a path, `-` for stdin, `<text>`, or the name of a live object.
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
    /// Wall-clock time spent loading, in milliseconds (a text handed to an isolated
    /// `rlm_query` child: the time `rlm` took to describe it; its worker loads it meanwhile).
    pub load_ms: f64,
    /// The library of its data frames (tables, workbooks, tables in a directory).
    #[serde(default)]
    pub frames: FrameLibrary,
    /// The compression the file was read through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// The source held nothing (0 bytes once decompressed, or a directory with no files).
    #[serde(default)]
    pub empty: bool,
    /// Malformed CSV rows left out (`LoadOptions::skip_bad_rows`), with the first one's line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_rows: Option<SkippedRows>,
    /// Files of a directory left out because they cannot be a context (images, archives, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_files: Vec<SkippedFile>,
    /// Files of a directory by the kind they were loaded as, e.g. `[(Text, 10), (Table, 2)]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_kinds: Vec<(ContextKind, u64)>,
    /// The sheets of a workbook, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sheets: Vec<SheetShape>,
}

/// One sheet of a workbook context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SheetShape {
    /// The sheet's name (its key in the `dict`).
    pub name: String,
    /// Rows below the header.
    pub rows: u64,
    /// Columns.
    pub columns: u64,
}

/// Malformed CSV rows left out of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedRows {
    /// How many.
    pub count: u64,
    /// The 1-based line of the first.
    pub first_line: u64,
}

/// How the source of a live Python object context starts (see [`ContextMetadata::is_live`]).
pub(crate) const LIVE_SOURCE_PREFIX: &str = "<python object: ";

impl ContextMetadata {
    /// Whether the context is a live Python object the caller passed (by reference), not a
    /// loaded file.
    pub fn is_live(&self) -> bool {
        self.source.starts_with(LIVE_SOURCE_PREFIX)
    }

    /// The Python type of its value, e.g. `polars.DataFrame`.
    pub fn python_type(&self) -> &'static str {
        self.kind.python_type(self.frames)
    }

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
            self.python_type(),
            self.source,
            parts.join(", ")
        )
    }

    /// What a user should know about how it loaded: empty, rows or files left out.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.empty {
            out.push(format!(
                "Context `{}` (`{}`) is empty; it loaded as an empty {}",
                self.name,
                self.source,
                self.python_type()
            ));
        }
        if let Some(rows) = self.skipped_rows {
            out.push(format!(
                "Skipped {} malformed row(s) of `{}` (the first at line {}), as `--csv-skip-bad-rows` asks",
                rows.count, self.source, rows.first_line
            ));
        }
        if !self.skipped_files.is_empty() {
            const LISTED: usize = 10;
            let mut listed: Vec<String> = self
                .skipped_files
                .iter()
                .take(LISTED)
                .map(|f| format!("`{}` ({})", f.path, f.kind.label()))
                .collect();
            if self.skipped_files.len() > LISTED {
                listed.push(format!("and {} more", self.skipped_files.len() - LISTED));
            }
            out.push(format!(
                "Skipped {} file(s) of the directory `{}` that cannot be a context: {}",
                self.skipped_files.len(),
                self.source,
                listed.join(", ")
            ));
        }
        out
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

/// A row of the support module's `list_variables`: name, type name, size, preview.
pub(crate) type VariableRow = (String, String, Option<usize>, String);

impl VariableInfo {
    /// The variable a [`VariableRow`] lists.
    pub(crate) fn from_row((name, type_name, size, preview): VariableRow) -> Self {
        Self {
            name,
            type_name,
            size,
            preview,
        }
    }

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

/// `text` as a sub-call's record keeps it: known secrets redacted first (so the cut never
/// keeps half of one), then cut to `limit` characters ([`head_and_tail`]).
pub(crate) fn kept_text(text: &str, limit: usize) -> String {
    head_and_tail(&bridge::secret::redactor().redact(text), limit)
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
    /// Calls of `llm_query` during the block. For a block whose worker process ended (its own
    /// counts ended with it), this count, `llm_query_batched_calls`, `sub_call_errors` and
    /// `sub_call_texts` are what the parent saw of the calls its code made.
    pub llm_query_calls: u32,
    /// Calls of `llm_query_batched` during the block.
    pub llm_query_batched_calls: u32,
    /// Answers the block's code got as an error instead of a sub-model's answer (an
    /// `"Error: …"` string or `LlmQueryError`; each slot of a batch counts), whatever failed,
    /// an `rlm_query` child that gave no answer included: the one count of failed sub-calls
    /// (`SessionMetrics::sub_call_errors`).
    #[serde(default)]
    pub sub_call_errors: u32,
    /// Final answers recorded during the block, at most one per convention, in the order
    /// first recorded: the `answer` dict's content at the moment `ready` turned true, and the
    /// value of the last `FINAL_VAR` call.
    pub final_answers: Vec<FinalAnswer>,
    /// The user's variables after the block.
    pub variables: Vec<VariableInfo>,
    /// Names the block created.
    pub new_variables: Vec<String>,
    /// The session's worker process ended during the block (or since the one before) and a
    /// fresh one took over; `None` in-process and in the normal case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<WorkerRestart>,
}

/// A worker process that ended under a session, and how the session was put back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRestart {
    /// Why the worker ended.
    pub cause: WorkerEnd,
    /// What the fresh worker holds.
    pub restore: Restore,
    /// Milliseconds from the end of the old worker until the new one was ready (contexts
    /// loaded, blocks replayed).
    pub restore_ms: f64,
}

/// How a worker process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkerEnd {
    /// A fatal signal in the worker's code (a segfault, an abort).
    Crashed {
        /// The signal's number.
        signal: i32,
        /// Its name and meaning, e.g. `SIGSEGV (segmentation fault)`.
        name: String,
    },
    /// The worker ran out of memory: at its memory limit (an allocator that aborted), or
    /// killed by the system's out-of-memory killer.
    OutOfMemory {
        /// The worker's memory limit, in bytes.
        limit_bytes: Option<u64>,
        /// The most memory it held, in bytes.
        peak_bytes: u64,
        /// The signal that ended it (`SIGKILL` from the system, or the abort of an allocator).
        signal: i32,
        /// For a `SIGKILL`: the out-of-memory kills the kernel counted while the worker ran,
        /// among the processes of its memory cgroup (on the machine where the group keeps no
        /// count, as the root group): at least one, the evidence that it was the killer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oom_kills: Option<u64>,
    },
    /// A signal sent from outside the session, never by a fault or a limit: a `SIGKILL`
    /// that, as far as the kernel tells, was not the out-of-memory killer's, or a signal that
    /// asks a process to end (`SIGTERM`, `SIGHUP`, `SIGINT`, `SIGQUIT`, `SIGUSR1`,
    /// `SIGUSR2`): a `kill` by a user, another program or the block's own code.
    Killed {
        /// The signal's number.
        signal: i32,
        /// The most memory it held, in bytes.
        peak_bytes: u64,
        /// For a `SIGKILL`: the out-of-memory kills the kernel counted while the worker ran,
        /// where an `OutOfMemory`'s are counted (`0`); `None` where the kernel does not count
        /// them, so memory cannot be ruled out (and for the other signals, which the killer
        /// does not send).
        oom_kills: Option<u64>,
    },
    /// The worker's code ended the process itself (a C-level `exit()`).
    Exited {
        /// Its exit status.
        code: i32,
    },
    /// The session ended the worker: the block did not stop when interrupted (stuck in
    /// native code) at its time limit or when the run stopped.
    Stopped {
        /// Milliseconds the block had run.
        after_ms: f64,
        /// The block's time limit had passed (else the run was stopped).
        timed_out: bool,
    },
    /// The worker broke its protocol or its link to the session.
    Lost {
        /// What happened.
        detail: String,
    },
}

/// What a fresh worker holds after a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Restore {
    /// The earlier blocks that ran to completion were run again, each sub-call answered from
    /// the session's record (no model call).
    Replayed {
        /// Blocks run again.
        blocks: usize,
        /// Of those, blocks that raised again (as they had the first time, or newly).
        raised: usize,
        /// Blocks left out because replaying them ended the worker again.
        skipped: usize,
        /// Sub-calls of the replay with no recorded answer (prompts that differed from the
        /// first run, e.g. built from the time or random numbers); they got an error.
        unanswered: usize,
    },
    /// Contexts only: the session asked for a fresh start (`on_crash = fresh`).
    Fresh,
    /// Not yet: the run was stopping; the session restores itself when next used.
    Deferred,
    /// The new worker could not be started or restored.
    Failed {
        /// Why.
        message: String,
    },
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
