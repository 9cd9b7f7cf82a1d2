//! Context loading: each [`ContextInput`] becomes one Python object, loaded once at session
//! start, described by a [`ContextMetadata`].
//!
//! | source | Python object | how |
//! |---|---|---|
//! | text file | `str` | streamed into the `str`'s own buffer, no second copy (`pystr.rs`); with `--encoding`, decoded by Python's codec |
//! | `-` (stdin), [`ContextSource::Text`] | `str` | UTF-8 check in Rust, one copy into Python |
//! | `.json` | `dict` / `list` | parsed by Python's C `json` while serde measures item sizes on another thread |
//! | `.jsonl` | `list` | parsed line by line by Python's `json`; on failure serde names the bad line |
//! | `.csv` `.tsv` `.parquet` `.arrow` `.ipc` `.feather` `.ndjson` | `polars.DataFrame` | Python polars reads the file itself |
//! | `.xlsx` `.xlsm` `.xlsb` `.xls` `.ods` | `polars.DataFrame`, or `dict` sheet → frame | polars' `read_excel` with the `fastexcel` (calamine) engine |
//! | directory | `dict` relative path → value | each file loaded as on its own; binaries skipped |
//! | [`ContextSource::Object`] | the caller's own object | bound by reference: no copy |
//! | [`ContextSource::Encoded`] (a child's `dict`, `list` or frame) | as the file of its format | the same loaders over bytes held in memory (a worker's memfd) |
//!
//! What a file is comes from its first bytes before its name (`detect.rs`): gzip and zstd
//! files are read through a decoder (`.csv.gz`, `.jsonl.zst`, `.txt.gz`), Parquet/Arrow/Excel
//! are tables whatever their extension, and images, PDFs, archives and other binaries fail
//! with advice that fits (in a directory they are skipped and listed in the metadata). A file
//! that is empty once decompressed loads as an empty value of its kind (`""`, `None` for
//! JSON, `[]`, an empty frame) and is flagged [`ContextMetadata::empty`].
//!
//! Tables are read by *Python* polars straight from the file: its native readers are
//! multi-threaded and build the DataFrame's Arrow buffers once, in the memory Python uses,
//! with no second copy. We deliberately do not compile Rust polars into the kernel: it would
//! cost minutes of build time on a 2-core machine and the hand-over to Python would still
//! need the pyarrow/FFI bridge, for no gain over letting Python polars read the file. With
//! [`FrameLibrary::Pandas`] the frame is converted afterwards, column by column.
//!
//! CSV: the separator is sniffed from the first lines (`,` `;` tab `|`) unless given. When
//! polars fails, Python's `csv` module scans the text for the first row with more fields than
//! the header (or broken quoting) to name its line; with `skip_bad_rows` such rows are left
//! out and counted. A failure with no such row is retried once with dtypes inferred from
//! every row (a late non-numeric value in a numeric-looking column).
//!
//! JSON objects are built by CPython's C `json` module, with the cyclic GC paused (it would
//! otherwise rescan the growing tree again and again: 2-4x slower). Converting a serde value
//! through pyo3 object by object makes the same C-API calls plus a second in-memory tree, so
//! Python's parser is the judge of validity (it also accepts `NaN`, as pandas writes it);
//! serde runs beside it, on another thread over the same UTF-8 buffer, to measure item sizes
//! from raw slices and to give exact line/column errors.
//!
//! Directories: files are read recursively in sorted order; entries whose name starts with
//! `.` (e.g. `.git`) are skipped and symbolic links to directories are not followed. A file
//! that fails to load (not UTF-8, malformed JSON) fails the whole load with an error naming it
//! (silently dropping it would change the answer without anyone noticing); only files that
//! cannot be a context at all are skipped, and listed.
//!
//! Any error leaves nothing behind: the session is not created.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::detect::{
    Detected, FileFormat, TableFormat, detect, in_memory, open_decoded, read_error, sniff_separator,
};
use super::error::{ReplError, RowProblem};
use super::metadata::{
    ContextKind, ContextMetadata, FrameLibrary, ItemSizes, LIVE_SOURCE_PREFIX, SheetShape,
    SkippedFile, SkippedRows,
};
use super::pystr::{TextFile, read_file_as_str};
use super::source::{
    ContextInput, ContextSource, EncodedContext, EncodedFormat, LiveObject, LoadOptions,
};

/// A loaded context: the Python object and its description.
pub(crate) struct LoadedContext<'py> {
    pub(crate) value: Bound<'py, PyAny>,
    pub(crate) metadata: ContextMetadata,
}

impl fmt::Debug for LoadedContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedContext")
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

fn blank_metadata(index: usize, name: String) -> ContextMetadata {
    ContextMetadata {
        index,
        name,
        kind: ContextKind::Text,
        source: String::new(),
        bytes: 0,
        chars: None,
        rows: None,
        columns: None,
        items: None,
        item_sizes: None,
        load_ms: 0.0,
        frames: FrameLibrary::Polars,
        compression: None,
        empty: false,
        skipped_rows: None,
        skipped_files: Vec::new(),
        file_kinds: Vec::new(),
        sheets: Vec::new(),
    }
}

/// Load one context into a Python object; `options.encoding` is already resolved (`None`
/// for UTF-8).
pub(crate) fn load_context<'py>(
    py: Python<'py>,
    index: usize,
    input: &ContextInput,
    options: &LoadOptions,
) -> Result<LoadedContext<'py>, ReplError> {
    let started = Instant::now();
    let mut meta = blank_metadata(index, context_name(index, input));
    let value = match &input.source {
        ContextSource::Text(text) => {
            meta.source = "<text>".to_owned();
            text_value(py, text, &mut meta)
        }
        ContextSource::Stdin => {
            meta.source = "-".to_owned();
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|source| ReplError::ContextStdin { source })?;
            meta.bytes = bytes.len() as u64;
            let text = utf8(bytes, Path::new("-"), "")?;
            text_value(py, &text, &mut meta)
        }
        ContextSource::Path(path) => {
            meta.source = path.display().to_string();
            load_path(py, path, &mut meta, options)?
        }
        ContextSource::Object(live) => {
            meta.source = format!("{LIVE_SOURCE_PREFIX}{}>", live.label);
            describe_object(py, live, &mut meta)?
        }
        ContextSource::Encoded(encoded) => {
            meta.source.clone_from(&encoded.source);
            load_encoded_value(py, encoded.format, &encoded.bytes, &mut meta, options)?
        }
    };
    meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(LoadedContext {
        value,
        metadata: meta,
    })
}

/// Loads context `index` from UTF-8 text held in memory elsewhere (a worker's memfd of text
/// given directly, or of standard input), named in the metadata as `source`: checked like
/// `-`, one copy into Python.
pub(crate) fn load_text_bytes<'py>(
    py: Python<'py>,
    index: usize,
    input: &ContextInput,
    source: &str,
    bytes: &[u8],
) -> Result<LoadedContext<'py>, ReplError> {
    let started = Instant::now();
    let text =
        std::str::from_utf8(bytes).map_err(|e| not_utf8(bytes, &e, Path::new(source), ""))?;
    let mut meta = describe_text(index, input, source, text);
    let value = PyString::new(py, text).into_any();
    meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(LoadedContext {
        value,
        metadata: meta,
    })
}

/// What [`load_text_bytes`] says of context `index` holding `text`, without loading it (no
/// Python): what rlm tells an isolated child's model while the child's worker loads the
/// same bytes (`load_ms` left at 0 for the caller).
pub(crate) fn describe_text(
    index: usize,
    input: &ContextInput,
    source: &str,
    text: &str,
) -> ContextMetadata {
    let mut meta = blank_metadata(index, context_name(index, input));
    meta.source = source.to_owned();
    meta.bytes = text.len() as u64;
    text_shape(text, &mut meta);
    meta
}

/// Loads context `index` as the live object `value` (a worker's copy of one the Python
/// package's host handed over), described like a live object bound by reference.
pub(crate) fn load_live_value<'py>(
    py: Python<'py>,
    index: usize,
    input: &ContextInput,
    label: &str,
    value: Bound<'py, PyAny>,
) -> Result<LoadedContext<'py>, ReplError> {
    let started = Instant::now();
    let mut meta = blank_metadata(index, context_name(index, input));
    meta.source = format!("{LIVE_SOURCE_PREFIX}{label}>");
    let value = describe_value(py, value, label, &mut meta)?;
    meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(LoadedContext {
        value,
        metadata: meta,
    })
}

/// Loads context `index` from a value a worker serialised for an `rlm_query` child, held in
/// memory elsewhere (the child's worker's memfd), named in the metadata as `source`: as a
/// file of that format named `source` is loaded, from these bytes (always UTF-8 text where
/// the format is text: the worker wrote it so).
pub(crate) fn load_encoded<'py>(
    py: Python<'py>,
    index: usize,
    input: &ContextInput,
    source: &str,
    format: EncodedFormat,
    bytes: &[u8],
    options: &LoadOptions,
) -> Result<LoadedContext<'py>, ReplError> {
    let started = Instant::now();
    let mut meta = blank_metadata(index, context_name(index, input));
    meta.source = source.to_owned();
    let value = load_encoded_value(py, format, bytes, &mut meta, options)?;
    meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(LoadedContext {
        value,
        metadata: meta,
    })
}

fn load_encoded_value<'py>(
    py: Python<'py>,
    format: EncodedFormat,
    bytes: &[u8],
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    meta.bytes = bytes.len() as u64;
    let format = match format {
        EncodedFormat::Json => FileFormat::Json,
        EncodedFormat::Parquet => FileFormat::Table(TableFormat::Parquet),
        EncodedFormat::Csv => FileFormat::Table(TableFormat::Csv),
    };
    let detected = in_memory(format, bytes);
    let options = LoadOptions {
        encoding: None,
        ..options.clone()
    };
    let path = PathBuf::from(&meta.source);
    let file = FileLoad {
        path: &path,
        detected: &detected,
        options: &options,
        hint: "",
        content: Some(bytes),
    };
    load_file(py, file, meta).map_err(|e| match e {
        ReplError::ContextMalformed {
            path,
            format,
            detail,
            ..
        } => ReplError::ContextMalformed {
            path,
            format,
            detail,
            fix: "it is what the parent's code handed to `rlm_query`, as its worker serialised it; hand over plain data (a `dict`, `list` or data frame) with the standard library's `json` and the frame's own writers in place".to_owned(),
        },
        other => other,
    })
}

/// What [`load_encoded`] will say of context `index`, a child's JSON, without loading it (no
/// Python), when that is sure: what rlm tells an isolated child's model while the child's
/// worker loads the same bytes (`load_ms` left at 0 for the caller). `None` when only
/// Python's parser can tell: bytes that are not UTF-8, JSON that serde rejects (Python
/// accepts some: `NaN`), or JSON past a limit of Python's that serde's scan does not have
/// ([`python_surely_parses`]).
pub(crate) fn describe_json(
    index: usize,
    input: &ContextInput,
    encoded: &EncodedContext,
) -> Option<ContextMetadata> {
    let mut meta = blank_metadata(index, context_name(index, input));
    meta.source.clone_from(&encoded.source);
    meta.bytes = encoded.bytes.len() as u64;
    meta.kind = ContextKind::Json;
    if encoded.bytes.is_empty() {
        meta.empty = true;
        meta.chars = Some(0);
        return Some(meta);
    }
    let text = std::str::from_utf8(&encoded.bytes).ok()?;
    if !python_surely_parses(text) {
        return None;
    }
    let sizes = json_item_sizes(text).ok()?;
    meta.chars = Some(char_len(text));
    set_item_stats(&mut meta, sizes);
    Some(meta)
}

/// Nesting deeper than this may meet Python's recursion limit in its JSON parser (1000 frames
/// by default, a few of them taken by the caller); serde's scan has no such limit.
const SURE_DEPTH: usize = 200;
/// An integer of more digits than this may meet Python's limit on converting text to `int`
/// (`sys.set_int_max_str_digits`: 4300 by default, never below 640); serde's scan skips
/// numbers without converting them.
const SURE_DIGITS: usize = 640;

/// Whether Python's `json.loads` surely accepts `text` that serde accepts: its nesting and
/// its runs of digits outside strings are within [`SURE_DEPTH`] and [`SURE_DIGITS`].
fn python_surely_parses(text: &str) -> bool {
    let (mut depth, mut digits) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        digits = if byte.is_ascii_digit() { digits + 1 } else { 0 };
        if depth > SURE_DEPTH || digits > SURE_DIGITS {
            return false;
        }
    }
    true
}

fn context_name(index: usize, input: &ContextInput) -> String {
    input
        .name
        .clone()
        .unwrap_or_else(|| format!("context_{index}"))
}

/// Binds a live object as it is, measuring it through `support.describe_object` (shapes and
/// counts only: nothing is read or copied).
fn describe_object<'py>(
    py: Python<'py>,
    live: &LiveObject,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    describe_value(py, live.object.bind(py).clone(), &live.label, meta)
}

fn describe_value<'py>(
    py: Python<'py>,
    value: Bound<'py, PyAny>,
    label: &str,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let action = "describing a live context";
    let described = support_call(py, "describe_object", (&value,), action)?;
    type Shape = (
        String,
        u64,
        Option<u64>,
        Option<u64>,
        Option<Vec<(String, String)>>,
        Option<u64>,
    );
    let (kind, bytes, chars, rows, columns, items): Shape = described
        .extract()
        .map_err(|e| ReplError::internal(action, e))?;
    (meta.kind, meta.frames) = match kind.as_str() {
        "text" => (ContextKind::Text, FrameLibrary::Polars),
        "json" => (ContextKind::Json, FrameLibrary::Polars),
        "table" => (ContextKind::Table, FrameLibrary::Polars),
        "pandas_table" => (ContextKind::Table, FrameLibrary::Pandas),
        _ => {
            return Err(ReplError::ContextType {
                label: label.to_owned(),
                type_name: kind,
            });
        }
    };
    meta.bytes = bytes;
    meta.chars = chars;
    meta.rows = rows;
    meta.columns = columns;
    meta.items = items;
    Ok(value)
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReplError + '_ {
    move |error| ReplError::ContextRead {
        path: path.to_owned(),
        error,
    }
}

fn load_path<'py>(
    py: Python<'py>,
    path: &Path,
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let info = std::fs::metadata(path).map_err(read_err(path))?;
    if info.is_dir() {
        meta.kind = ContextKind::Directory;
        return load_directory(py, path, meta, options);
    }
    meta.bytes = info.len();
    let detected = detect(path, options.encoding.is_some())?;
    let file = FileLoad {
        path,
        detected: &detected,
        options,
        hint: "",
        content: None,
    };
    load_file(py, file, meta)
}

/// One recognised file being loaded.
#[derive(Debug, Clone, Copy)]
struct FileLoad<'a> {
    path: &'a Path,
    detected: &'a Detected,
    options: &'a LoadOptions,
    /// Added to a not-UTF-8 error (e.g. for a file inside a directory context).
    hint: &'a str,
    /// The content, when it is held in memory ([`load_encoded`]: never compressed, UTF-8
    /// where the format is text); `None`: read from `path`.
    content: Option<&'a [u8]>,
}

impl FileLoad<'_> {
    fn text_file(&self) -> TextFile<'_> {
        TextFile {
            path: self.path,
            compression: self.detected.compression,
        }
    }

    /// The text as a `str` (UTF-8) and its length in characters.
    fn utf8_str<'py>(&self, py: Python<'py>) -> Result<(Bound<'py, PyString>, u64), ReplError> {
        match self.content {
            None => read_file_as_str(py, self.text_file(), self.hint),
            Some(bytes) => {
                let text = std::str::from_utf8(bytes)
                    .map_err(|e| not_utf8(bytes, &e, self.path, self.hint))?;
                Ok((PyString::new(py, text), char_len(text)))
            }
        }
    }

    /// What a polars reader is given: the path (polars reads the file itself), the content
    /// held in memory as `bytes` (which can be read again), or the decompressed content as a
    /// `BytesIO`.
    fn table_source<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyAny>, ReplError> {
        match (self.content, self.detected.compression) {
            (Some(bytes), _) => Ok(PyBytes::new(py, bytes).into_any()),
            (None, None) => Ok(PyString::new(py, &self.path.to_string_lossy()).into_any()),
            (None, Some(_)) => {
                let bytes = PyBytes::new(py, &self.decompressed()?);
                py.import("io")
                    .and_then(|io| io.call_method1("BytesIO", (bytes,)))
                    .map_err(|e| ReplError::internal("reading a compressed table", e))
            }
        }
    }

    /// The whole decompressed content, for the rare readers that cannot stream it.
    fn decompressed(&self) -> Result<Vec<u8>, ReplError> {
        let compression = self.detected.compression;
        let mut bytes = Vec::new();
        open_decoded(self.path, compression)
            .and_then(|mut r| r.read_to_end(&mut bytes))
            .map_err(|e| read_error(self.path, compression, e))?;
        Ok(bytes)
    }
}

fn load_file<'py>(
    py: Python<'py>,
    file: FileLoad<'_>,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let FileLoad { path, detected, .. } = file;
    meta.compression = detected.compression;
    meta.kind = match detected.format {
        FileFormat::Text => ContextKind::Text,
        FileFormat::Json => ContextKind::Json,
        FileFormat::JsonLines => ContextKind::JsonLines,
        FileFormat::Table(_) => ContextKind::Table,
    };
    if detected.empty {
        meta.empty = true;
        return empty_value(py, path, detected.format, meta, file.options);
    }
    match detected.format {
        FileFormat::Text => Ok(load_text(py, file, meta)?.into_any()),
        FileFormat::Json => {
            let py_text = load_text(py, file, meta)?;
            // CPython's parser builds the objects (and is the judge: it accepts `NaN`, as
            // pandas writes it); meanwhile serde measures item sizes on another thread and,
            // if Python fails, supplies the line/column error.
            // Borrowed (no copy) except under the stable ABI before Python 3.10.
            let text = py_text
                .to_cow()
                .map_err(|e| ReplError::internal("reading a JSON context", e))?;
            let text: &str = &text;
            std::thread::scope(|scope| {
                let sizes = scope.spawn(|| json_item_sizes(text));
                let parsed = support_call(py, "json_loads", (&py_text,), "parsing a JSON context");
                let sizes = sizes.join();
                match (parsed, sizes) {
                    (Ok(value), Ok(Ok(sizes))) => {
                        set_item_stats(meta, sizes);
                        Ok(value)
                    }
                    (Ok(value), _) => Ok(value),
                    (Err(_), Ok(Err(e))) => Err(malformed_json(path, &e.to_string())),
                    (Err(e), _) => Err(malformed_json(path, &python_error_text(&e))),
                }
            })
        }
        FileFormat::JsonLines => {
            let py_text = load_text(py, file, meta)?;
            // Borrowed (no copy) except under the stable ABI before Python 3.10.
            let text = py_text
                .to_cow()
                .map_err(|e| ReplError::internal("reading a JSON-lines context", e))?;
            let text: &str = &text;
            let sizes: Vec<u64> = text
                .split('\n')
                .filter(|line| !line.trim().is_empty())
                .map(|line| char_len(line.trim_end_matches('\r')))
                .collect();
            match support_call(
                py,
                "jsonl_loads",
                (&py_text,),
                "parsing a JSON-lines context",
            ) {
                Ok(value) => {
                    set_item_stats(meta, Some(sizes));
                    Ok(value)
                }
                // Find the bad line for the message.
                Err(e) => Err(json_lines_error(text, path)
                    .unwrap_or_else(|| malformed_json_lines(path, python_error_text(&e)))),
            }
        }
        FileFormat::Table(format) => load_table(py, file, format, meta),
    }
}

/// The value of a file with nothing in it: `""`, `None`, `[]` or an empty frame.
fn empty_value<'py>(
    py: Python<'py>,
    path: &Path,
    format: FileFormat,
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    match format {
        FileFormat::Text => {
            meta.chars = Some(0);
            Ok(PyString::new(py, "").into_any())
        }
        FileFormat::Json => {
            meta.chars = Some(0);
            Ok(py.None().into_bound(py))
        }
        FileFormat::JsonLines => {
            meta.chars = Some(0);
            meta.items = Some(0);
            Ok(PyList::empty(py).into_any())
        }
        FileFormat::Table(_) => {
            let frame = import(py, "polars", path)?
                .call_method0("DataFrame")
                .map_err(|e| ReplError::internal("making an empty table", e))?;
            finish_frame(py, path, frame, meta, options)
        }
    }
}

/// The text of a file as a `str`: streamed without a copy, or decoded by the named codec.
fn load_text<'py>(
    py: Python<'py>,
    file: FileLoad<'_>,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyString>, ReplError> {
    let path = file.path;
    let Some(encoding) = &file.options.encoding else {
        let (text, chars) = file.utf8_str(py)?;
        meta.chars = Some(chars);
        return Ok(text);
    };
    let data = match file.detected.compression {
        None => None,
        Some(_) => Some(PyBytes::new(py, &file.decompressed()?)),
    };
    let text = interpreter_support(py)?
        .call_method1(
            "read_text",
            (path.to_string_lossy().as_ref(), data, encoding.as_str()),
        )
        .map_err(|e| ReplError::ContextMalformed {
            path: path.to_owned(),
            format: "text in the named encoding",
            detail: first_line(&e.to_string()).into_owned(),
            fix: "check `--encoding`".to_owned(),
        })?
        .cast_into::<PyString>()
        .map_err(|e| ReplError::internal("decoding a text context", e))?;
    meta.chars = Some(
        text.len()
            .map_err(|e| ReplError::internal("decoding a text context", e))? as u64,
    );
    Ok(text)
}

fn text_value<'py>(py: Python<'py>, text: &str, meta: &mut ContextMetadata) -> Bound<'py, PyAny> {
    text_shape(text, meta);
    PyString::new(py, text).into_any()
}

/// A text context's kind, size, characters and emptiness.
fn text_shape(text: &str, meta: &mut ContextMetadata) {
    meta.kind = ContextKind::Text;
    if meta.bytes == 0 {
        meta.bytes = text.len() as u64;
    }
    meta.chars = Some(text.chars().count() as u64);
    meta.empty = text.is_empty();
}

fn set_item_stats(meta: &mut ContextMetadata, sizes: Option<Vec<u64>>) {
    if let Some(sizes) = sizes {
        meta.items = Some(sizes.len() as u64);
        meta.item_sizes = ItemSizes::from_sizes(sizes);
    }
}

fn python_error_text(e: &ReplError) -> String {
    match e {
        ReplError::Internal { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn utf8(bytes: Vec<u8>, path: &Path, hint: &str) -> Result<String, ReplError> {
    String::from_utf8(bytes).map_err(|e| not_utf8(e.as_bytes(), &e.utf8_error(), path, hint))
}

fn not_utf8(bytes: &[u8], error: &std::str::Utf8Error, path: &Path, hint: &str) -> ReplError {
    let offset = error.valid_up_to();
    let line = bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1;
    ReplError::ContextNotUtf8 {
        path: path.to_owned(),
        offset,
        line,
        hint: hint.to_owned(),
    }
}

fn char_len(s: &str) -> u64 {
    s.chars().count() as u64
}

/// Item sizes of a JSON document's top-level array/object (None for a scalar); validates it.
fn json_item_sizes(text: &str) -> Result<Option<Vec<u64>>, serde_json::Error> {
    struct Sizes;
    impl<'de> Visitor<'de> for Sizes {
        type Value = Option<Vec<u64>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut sizes = Vec::new();
            while let Some(item) = seq.next_element::<&'de RawValue>()? {
                sizes.push(char_len(item.get()));
            }
            Ok(Some(sizes))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut sizes = Vec::new();
            while let Some((_, item)) = map.next_entry::<IgnoredAny, &'de RawValue>()? {
                sizes.push(char_len(item.get()));
            }
            Ok(Some(sizes))
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let sizes = (&mut de).deserialize_any(Sizes)?;
    de.end()?;
    Ok(sizes)
}

fn malformed_json(path: &Path, detail: &str) -> ReplError {
    ReplError::ContextMalformed {
        path: path.to_owned(),
        format: "JSON",
        detail: detail.to_owned(),
        fix: "fix the file, or rename it (e.g. to `.txt`) to load it as plain text".to_owned(),
    }
}

fn malformed_json_lines(path: &Path, detail: String) -> ReplError {
    ReplError::ContextMalformed {
        path: path.to_owned(),
        format: "JSON lines",
        detail,
        fix: "every non-blank line must be one JSON value; fix that line, or rename the file (e.g. to `.txt`) to load it as plain text".to_owned(),
    }
}

/// The first line of a JSON-lines text that is not one JSON value, as an error.
fn json_lines_error(text: &str, path: &Path) -> Option<ReplError> {
    text.split('\n').enumerate().find_map(|(i, line)| {
        if line.trim().is_empty() {
            return None;
        }
        serde_json::from_str::<IgnoredAny>(line)
            .err()
            .map(|e| malformed_json_lines(path, format!("line {}: {e}", i + 1)))
    })
}

fn support_call<'py>(
    py: Python<'py>,
    function: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
    action: &'static str,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let support = interpreter_support(py)?;
    support
        .call_method1(function, args)
        .map_err(|e| ReplError::internal(action, e))
}

fn interpreter_support(py: Python<'_>) -> Result<&Bound<'_, PyModule>, ReplError> {
    Ok(super::interpreter::interpreter(py)?.support(py))
}

fn import<'py>(
    py: Python<'py>,
    package: &str,
    path: &Path,
) -> Result<Bound<'py, PyModule>, ReplError> {
    py.import(package).map_err(|e| ReplError::MissingPackage {
        package: package.to_owned(),
        path: path.to_owned(),
        message: e.to_string(),
        host: super::interpreter::host(),
    })
}

fn load_table<'py>(
    py: Python<'py>,
    file: FileLoad<'_>,
    format: TableFormat,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let FileLoad { path, options, .. } = file;
    let polars = import(py, "polars", path)?;
    let path_text = path.to_string_lossy();
    let malformed = |e: PyErr| table_error(path, format, &e);
    let frame = match format {
        TableFormat::Csv | TableFormat::Tsv => load_csv(py, &polars, file, format, meta)?,
        TableFormat::Excel => {
            import(py, "fastexcel", path)?;
            let sheets = interpreter_support(py)?
                .call_method1("read_excel", (&polars, path_text.as_ref()))
                .map_err(malformed)?
                .cast_into::<PyDict>()
                .map_err(|e| ReplError::internal("reading an Excel context", e))?;
            if sheets.len() != 1 {
                return load_workbook(py, path, &sheets, meta, options);
            }
            sheets
                .values()
                .get_item(0)
                .map_err(|e| ReplError::internal("reading an Excel context", e))?
        }
        TableFormat::Parquet | TableFormat::Ipc | TableFormat::NdJson => {
            let reader = match format {
                TableFormat::Parquet => "read_parquet",
                TableFormat::Ipc => "read_ipc",
                _ => "read_ndjson",
            };
            // polars decompresses only CSV itself.
            let source = file.table_source(py)?;
            polars.call_method1(reader, (source,)).map_err(malformed)?
        }
    };
    finish_frame(py, path, frame, meta, options)
}

/// Describes a polars frame into `meta` and converts it to the asked library.
fn finish_frame<'py>(
    py: Python<'py>,
    path: &Path,
    frame: Bound<'py, PyAny>,
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let (rows, columns) = frame_shape(py, &frame)?;
    meta.rows = Some(rows);
    meta.columns = Some(columns);
    meta.frames = options.frames;
    convert_frame(py, path, frame, options)
}

fn frame_shape(
    py: Python<'_>,
    frame: &Bound<'_, PyAny>,
) -> Result<(u64, Vec<(String, String)>), ReplError> {
    support_call(py, "table_shape", (frame,), "describing a table context")?
        .extract()
        .map_err(|e| ReplError::internal("describing a table context", e))
}

fn convert_frame<'py>(
    py: Python<'py>,
    path: &Path,
    frame: Bound<'py, PyAny>,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    match options.frames {
        FrameLibrary::Polars => Ok(frame),
        FrameLibrary::Pandas => {
            import(py, "pandas", path)?;
            support_call(py, "to_pandas", (frame,), "converting a table to pandas")
        }
    }
}

/// A workbook of several sheets: `dict` sheet name → frame.
fn load_workbook<'py>(
    py: Python<'py>,
    path: &Path,
    sheets: &Bound<'py, PyDict>,
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    meta.kind = ContextKind::Workbook;
    meta.frames = options.frames;
    meta.items = Some(sheets.len() as u64);
    let out = PyDict::new(py);
    for (name, frame) in sheets.iter() {
        let (rows, columns) = frame_shape(py, &frame)?;
        meta.sheets.push(SheetShape {
            name: name.to_string(),
            rows,
            columns: columns.len() as u64,
        });
        out.set_item(name, convert_frame(py, path, frame, options)?)
            .map_err(|e| ReplError::internal("reading an Excel context", e))?;
    }
    Ok(out.into_any())
}

fn table_error(path: &Path, format: TableFormat, e: &PyErr) -> ReplError {
    ReplError::ContextMalformed {
        path: path.to_owned(),
        format: format.label(),
        detail: first_line(&e.to_string()).into_owned(),
        fix: match format {
            TableFormat::Csv | TableFormat::Tsv => "check the separator (`--csv-sep`), header and quoting, and the encoding (`--encoding`), or rename the file (e.g. to `.txt`) to load it as plain text".to_owned(),
            _ => "check that the file is complete and really in this format, or convert it".to_owned(),
        },
    }
}

/// A CSV or TSV file (see the module docs for the fallbacks on failure).
fn load_csv<'py>(
    py: Python<'py>,
    polars: &Bound<'py, PyModule>,
    file: FileLoad<'_>,
    format: TableFormat,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let FileLoad {
        path,
        detected,
        options,
        ..
    } = file;
    let separator = options.csv_separator.unwrap_or_else(|| match format {
        TableFormat::Tsv => b'\t',
        _ => sniff_separator(&detected.head),
    });
    let separator = char::from(separator).to_string();
    let support = interpreter_support(py)?;
    // With an encoding, polars reads the decoded text; without, the file itself (its path,
    // or the content held in memory: CSV in memory is never compressed).
    let source = file.table_source(py)?;
    let decoded = match options.encoding {
        Some(_) => Some(load_text(py, file, meta)?),
        None => None,
    };
    meta.chars = None;
    let read = |text: Option<&Bound<'py, PyString>>, infer_all: bool| {
        support.call_method1(
            "read_csv",
            (polars, &source, text, separator.as_str(), infer_all),
        )
    };
    let first_error = match read(decoded.as_ref(), false) {
        Ok(frame) => return Ok(frame),
        Err(e) => e,
    };
    let text = match decoded.clone() {
        Some(text) => text,
        None => file.utf8_str(py)?.0,
    };
    let scan = support
        .call_method1(
            "csv_bad_rows",
            (&text, separator.as_str(), options.skip_bad_rows),
        )
        .map_err(|e| ReplError::internal("scanning a CSV context", e))?;
    type Scan = (u64, Option<u64>, Option<u64>, Option<u64>, Option<String>);
    let (count, first_line, first_fields, expected, cleaned): Scan = scan
        .extract()
        .map_err(|e| ReplError::internal("scanning a CSV context", e))?;
    let Some(first_line) = first_line else {
        // No ragged row: the dtypes guessed from the first rows may not fit a later one.
        return read(decoded.as_ref(), true).map_err(|_| table_error(path, format, &first_error));
    };
    if !options.skip_bad_rows {
        let problem = match (first_fields, expected) {
            (Some(found), Some(expected)) => RowProblem::ExtraFields { found, expected },
            _ => RowProblem::Quoting,
        };
        return Err(ReplError::ContextBadRow {
            path: path.to_owned(),
            line: first_line,
            problem,
            separator: separator.escape_default().to_string(),
        });
    }
    meta.skipped_rows = Some(SkippedRows { count, first_line });
    let cleaned = PyString::new(py, cleaned.as_deref().unwrap_or_default());
    drop(text);
    read(Some(&cleaned), false)
        .or_else(|_| read(Some(&cleaned), true))
        .map_err(|e| table_error(path, format, &e))
}

fn first_line(s: &str) -> Cow<'_, str> {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s);
    Cow::Borrowed(line.trim())
}

fn load_directory<'py>(
    py: Python<'py>,
    root: &Path,
    meta: &mut ContextMetadata,
    options: &LoadOptions,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let mut files = Vec::new();
    collect_files(root, Path::new(""), &mut files)?;
    let dict = PyDict::new(py);
    let mut sizes = Vec::with_capacity(files.len());
    let mut kinds = std::collections::BTreeMap::<ContextKind, u64>::new();
    let hint = format!(
        "; it is part of the directory context `{}`: remove or move it, or pass the files you need individually",
        root.display()
    );
    for relative in files {
        let path = root.join(&relative);
        let key = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let detected = match detect(&path, options.encoding.is_some()) {
            Ok(detected) => detected,
            Err(ReplError::ContextBinary { kind, .. }) => {
                meta.skipped_files.push(SkippedFile { path: key, kind });
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut file_meta = blank_metadata(0, String::new());
        file_meta.bytes = std::fs::metadata(&path).map_err(read_err(&path))?.len();
        let file = FileLoad {
            path: &path,
            detected: &detected,
            options,
            hint: &hint,
            content: None,
        };
        let value = load_file(py, file, &mut file_meta)?;
        meta.bytes += file_meta.bytes;
        if let Some(chars) = file_meta.chars {
            sizes.push(chars);
        }
        if file_meta.kind == ContextKind::Table || file_meta.kind == ContextKind::Workbook {
            meta.frames = options.frames;
        }
        *kinds.entry(file_meta.kind).or_default() += 1;
        dict.set_item(key, value)
            .map_err(|e| ReplError::internal("building a directory context", e))?;
    }
    let loaded: u64 = kinds.values().sum();
    meta.empty = loaded == 0;
    meta.chars = Some(sizes.iter().sum());
    meta.items = Some(loaded);
    meta.item_sizes = ItemSizes::from_sizes(sizes);
    meta.file_kinds = kinds.into_iter().collect();
    Ok(dict.into_any())
}

/// Relative paths of the regular files under `root/relative`, sorted, hidden entries skipped.
fn collect_files(root: &Path, relative: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReplError> {
    let dir = root.join(relative);
    let mut entries = std::fs::read_dir(&dir)
        .map_err(read_err(&dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err(&dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let child = relative.join(&name);
        let file_type = entry.file_type().map_err(read_err(&entry.path()))?;
        if file_type.is_dir() {
            collect_files(root, &child, out)?;
        } else if file_type.is_symlink() {
            // Follow links to files, never to directories (no cycles, no escaping the tree).
            let target = std::fs::metadata(entry.path()).map_err(read_err(&entry.path()))?;
            if target.is_file() {
                out.push(child);
            }
        } else if file_type.is_file() {
            out.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(json: &[u8]) -> EncodedContext {
        EncodedContext {
            source: "/scratch/rlm-child-context-1-0.json".to_owned(),
            format: EncodedFormat::Json,
            bytes: std::sync::Arc::new(json.to_vec()),
        }
    }

    /// What the worker's load of `json` says, or its error.
    fn loaded(json: &[u8]) -> Result<ContextMetadata, ReplError> {
        crate::repl::interpreter::start().expect("interpreter");
        let input = ContextInput::from(ContextSource::Encoded(encoded(json)));
        let encoded = encoded(json);
        Python::attach(|py| {
            load_encoded(
                py,
                0,
                &input,
                &encoded.source,
                encoded.format,
                &encoded.bytes,
                &LoadOptions::default(),
            )
            .map(|loaded| ContextMetadata {
                load_ms: 0.0,
                ..loaded.metadata
            })
        })
    }

    #[test]
    fn a_childs_json_described_ahead_is_what_its_load_says_and_only_python_judges_the_rest() {
        let records: String = format!(
            "[{}]",
            (0..1000)
                .map(|i| format!("{{\"id\": {i}, \"name\": \"n{i}\"}}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let deep = format!(
            "{}{}",
            "[".repeat(SURE_DEPTH + 1),
            "]".repeat(SURE_DEPTH + 1)
        );
        let long_int = format!("[{}]", "7".repeat(SURE_DIGITS + 1));
        let in_strings = format!("[\"{}\", \"{}\"]", "[".repeat(500), "9".repeat(5000));
        // Described ahead: exactly what the load says.
        let sure: Vec<&[u8]> = vec![
            records.as_bytes(),
            br#"{"a": [1, 2], "b": "x", "c": null}"#,
            br#"{"a": 1, "a": 2}"#,
            br#"[1e400, -0, "\ud800", "h\u00e9"]"#,
            b"[]",
            b"42",
            b"null",
            b"",
            in_strings.as_bytes(),
        ];
        for json in sure {
            let input = ContextInput::from(ContextSource::Encoded(encoded(json)));
            let ahead = describe_json(0, &input, &encoded(json));
            let shown = String::from_utf8_lossy(json);
            let ahead = ahead.unwrap_or_else(|| panic!("not described ahead: {shown:.80}"));
            assert_eq!(loaded(json).expect("loads"), ahead, "{shown:.80}");
        }
        // Only Python can tell: the worker describes them (or fails), never rlm.
        let python_judges: Vec<&[u8]> = vec![
            br#"{"x": NaN}"#,
            br#"[1, 2"#,
            b"[1] x",
            deep.as_bytes(),
            long_int.as_bytes(),
            b"\xff[1]",
            "\u{feff}[1]".as_bytes(),
        ];
        for json in python_judges {
            let input = ContextInput::from(ContextSource::Encoded(encoded(json)));
            let shown = String::from_utf8_lossy(json);
            assert!(
                describe_json(0, &input, &encoded(json)).is_none(),
                "{shown:.80}"
            );
        }
        // What Python accepts loads (without item sizes); what it refuses is a clear error.
        let nan = loaded(br#"{"x": NaN}"#).expect("Python accepts NaN");
        assert_eq!((nan.kind, nan.items), (ContextKind::Json, None));
        assert!(loaded(deep.as_bytes()).is_ok(), "within Python's limit");
        for bad in [&b"[1, 2"[..], b"\xff[1]", "\u{feff}[1]".as_bytes()] {
            let error = loaded(bad).expect_err("malformed").to_string();
            assert!(error.contains("rlm-child-context-1-0.json"), "{error}");
        }
        let too_deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(loaded(too_deep.as_bytes()).is_err());
        let too_long = format!("[{}]", "7".repeat(5000));
        assert!(loaded(too_long.as_bytes()).is_err());
    }

    #[test]
    fn json_item_sizes_cover_arrays_objects_and_scalars() {
        assert_eq!(
            json_item_sizes("[1, \"ab\", {\"x\": 1}]").expect("valid"),
            Some(vec![1, 4, 8])
        );
        assert_eq!(
            json_item_sizes("{\"a\": [1,2], \"b\": null}").expect("valid"),
            Some(vec![5, 4])
        );
        assert_eq!(json_item_sizes(" 42 ").expect("valid"), None);
        assert!(json_item_sizes("[1, 2").is_err());
        assert!(json_item_sizes("[1] x").is_err());
    }
}
