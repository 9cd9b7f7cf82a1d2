//! Context loading: each [`ContextSource`] becomes one Python object, loaded once at session
//! start, described by a [`ContextMetadata`].
//!
//! | source | Python object | how |
//! |---|---|---|
//! | text file | `str` | streamed into the `str`'s own buffer, no second copy (`pystr.rs`) |
//! | `-` (stdin), [`ContextSource::Text`] | `str` | UTF-8 check in Rust, one copy into Python |
//! | `.json` | `dict` / `list` | parsed by Python's C `json` while serde measures item sizes on another thread |
//! | `.jsonl` | `list` | parsed line by line by Python's `json`; on failure serde names the bad line |
//! | `.csv` `.tsv` `.parquet` `.arrow` `.ipc` `.feather` `.ndjson` | `polars.DataFrame` | Python polars reads the file itself |
//! | directory | `dict` relative path → text | walked in sorted order |
//!
//! Tables are read by *Python* polars straight from the file: its native readers are
//! multi-threaded and build the DataFrame's Arrow buffers once, in the memory Python uses,
//! with no second copy. We deliberately do not compile Rust polars into the kernel: it would
//! cost minutes of build time on a 2-core machine and the hand-over to Python would still
//! need the pyarrow/FFI bridge, for no gain over letting Python polars read the file.
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
//! that is not UTF-8 text fails the whole load with an error naming it (silently dropping a
//! file would change the answer without anyone noticing).
//!
//! Any error leaves nothing behind: the session is not created.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::error::ReplError;
use super::metadata::{ContextKind, ContextMetadata, ItemSizes};
use super::pystr::read_file_as_str;

/// Where a context comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextSource {
    /// A file (format by extension) or a directory.
    Path(PathBuf),
    /// Standard input, read to the end as text (`-` on the command line).
    Stdin,
    /// Text given directly.
    Text(String),
}

impl ContextSource {
    /// `-` means stdin, anything else a path.
    pub fn from_arg(arg: &str) -> Self {
        if arg == "-" {
            Self::Stdin
        } else {
            Self::Path(PathBuf::from(arg))
        }
    }
}

/// How a file will be loaded, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileFormat {
    Text,
    Json,
    JsonLines,
    Table(TableFormat),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableFormat {
    Csv,
    Tsv,
    Parquet,
    Ipc,
    NdJson,
}

impl TableFormat {
    fn label(self) -> &'static str {
        match self {
            Self::Csv => "CSV",
            Self::Tsv => "TSV",
            Self::Parquet => "Parquet",
            Self::Ipc => "Arrow IPC",
            Self::NdJson => "newline-delimited JSON",
        }
    }
}

fn file_format(path: &Path) -> FileFormat {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match ext.as_str() {
        "json" => FileFormat::Json,
        "jsonl" => FileFormat::JsonLines,
        "csv" => FileFormat::Table(TableFormat::Csv),
        "tsv" => FileFormat::Table(TableFormat::Tsv),
        "parquet" | "pq" => FileFormat::Table(TableFormat::Parquet),
        "arrow" | "ipc" | "feather" => FileFormat::Table(TableFormat::Ipc),
        "ndjson" => FileFormat::Table(TableFormat::NdJson),
        _ => FileFormat::Text,
    }
}

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

/// Load one context into a Python object.
pub(crate) fn load_context<'py>(
    py: Python<'py>,
    index: usize,
    source: &ContextSource,
) -> Result<LoadedContext<'py>, ReplError> {
    let started = Instant::now();
    let mut meta = ContextMetadata {
        index,
        name: format!("context_{index}"),
        kind: ContextKind::Text,
        source: String::new(),
        bytes: 0,
        chars: None,
        rows: None,
        columns: None,
        items: None,
        item_sizes: None,
        load_ms: 0.0,
    };
    let value = match source {
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
            let text = utf8(bytes, Path::new("-"), "")?;
            text_value(py, &text, &mut meta)
        }
        ContextSource::Path(path) => {
            meta.source = path.display().to_string();
            load_path(py, path, &mut meta)?
        }
    };
    meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(LoadedContext {
        value,
        metadata: meta,
    })
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReplError + '_ {
    move |source| ReplError::ContextRead {
        path: path.to_owned(),
        source,
    }
}

fn load_path<'py>(
    py: Python<'py>,
    path: &Path,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let info = std::fs::metadata(path).map_err(read_err(path))?;
    if info.is_dir() {
        meta.kind = ContextKind::Directory;
        return load_directory(py, path, meta);
    }
    meta.bytes = info.len();
    match file_format(path) {
        FileFormat::Text => {
            meta.kind = ContextKind::Text;
            let (text, chars) = read_file_as_str(py, path, "")?;
            meta.chars = Some(chars);
            Ok(text.into_any())
        }
        FileFormat::Json => {
            meta.kind = ContextKind::Json;
            let py_text = read_py_text(py, path, meta)?;
            // CPython's parser builds the objects (and is the judge: it accepts `NaN`, as
            // pandas writes it); meanwhile serde measures item sizes on another thread and,
            // if Python fails, supplies the line/column error.
            let text = py_text
                .to_str()
                .map_err(|e| ReplError::internal("reading a JSON context", e))?;
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
            meta.kind = ContextKind::JsonLines;
            let py_text = read_py_text(py, path, meta)?;
            let text = py_text
                .to_str()
                .map_err(|e| ReplError::internal("reading a JSON-lines context", e))?;
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
        FileFormat::Table(format) => {
            meta.kind = ContextKind::Table;
            load_table(py, path, format, meta)
        }
    }
}

fn text_value<'py>(py: Python<'py>, text: &str, meta: &mut ContextMetadata) -> Bound<'py, PyAny> {
    meta.kind = ContextKind::Text;
    if meta.bytes == 0 {
        meta.bytes = text.len() as u64;
    }
    meta.chars = Some(text.chars().count() as u64);
    PyString::new(py, text).into_any()
}

/// Read a UTF-8 file straight into a Python `str`, with no second copy (see [`read_file_as_str`]).
fn read_py_text<'py>(
    py: Python<'py>,
    path: &Path,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyString>, ReplError> {
    let (text, chars) = read_file_as_str(py, path, "")?;
    meta.chars = Some(chars);
    Ok(text)
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

fn read_text(path: &Path, hint: &str) -> Result<String, ReplError> {
    let bytes = std::fs::read(path).map_err(read_err(path))?;
    utf8(bytes, path, hint)
}

fn utf8(bytes: Vec<u8>, path: &Path, hint: &str) -> Result<String, ReplError> {
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let line = bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1;
        ReplError::ContextNotUtf8 {
            path: path.to_owned(),
            offset,
            line,
            hint: hint.to_owned(),
        }
    })
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
    let support = super::interpreter::interpreter(py)?.support(py);
    support
        .call_method1(function, args)
        .map_err(|e| ReplError::internal(action, e))
}

fn load_table<'py>(
    py: Python<'py>,
    path: &Path,
    format: TableFormat,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let polars = py.import("polars").map_err(|e| ReplError::MissingPackage {
        package: "polars".to_owned(),
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let path_text = path.to_string_lossy();
    let frame = match format {
        TableFormat::Csv => polars.call_method1("read_csv", (path_text.as_ref(),)),
        TableFormat::Tsv => {
            let kwargs = PyDict::new(py);
            kwargs
                .set_item("separator", "\t")
                .map_err(|e| ReplError::internal("reading a TSV context", e))?;
            polars.call_method("read_csv", (path_text.as_ref(),), Some(&kwargs))
        }
        TableFormat::Parquet => polars.call_method1("read_parquet", (path_text.as_ref(),)),
        TableFormat::Ipc => polars.call_method1("read_ipc", (path_text.as_ref(),)),
        TableFormat::NdJson => polars.call_method1("read_ndjson", (path_text.as_ref(),)),
    }
    .map_err(|e| ReplError::ContextMalformed {
        path: path.to_owned(),
        format: format.label(),
        detail: first_line(&e.to_string()).into_owned(),
        fix: match format {
            TableFormat::Csv | TableFormat::Tsv => "check the delimiter, header and quoting and that the file is UTF-8, or rename it (e.g. to `.txt`) to load it as plain text".to_owned(),
            _ => "check that the file is complete and really in this format, or convert it".to_owned(),
        },
    })?;
    let shape = support_call(py, "table_shape", (&frame,), "describing a table context")?;
    let (rows, columns): (u64, Vec<(String, String)>) = shape
        .extract()
        .map_err(|e| ReplError::internal("describing a table context", e))?;
    meta.rows = Some(rows);
    meta.columns = Some(columns);
    Ok(frame)
}

fn first_line(s: &str) -> Cow<'_, str> {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s);
    Cow::Borrowed(line.trim())
}

fn load_directory<'py>(
    py: Python<'py>,
    root: &Path,
    meta: &mut ContextMetadata,
) -> Result<Bound<'py, PyAny>, ReplError> {
    let mut files = Vec::new();
    collect_files(root, Path::new(""), &mut files)?;
    let dict = PyDict::new(py);
    let mut sizes = Vec::with_capacity(files.len());
    let mut bytes = 0u64;
    let hint = format!(
        "; it is part of the directory context `{}`: remove or move it, or pass the text files you need individually",
        root.display()
    );
    for relative in files {
        let path = root.join(&relative);
        let text = read_text(&path, &hint)?;
        bytes += text.len() as u64;
        sizes.push(char_len(&text));
        let key = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        dict.set_item(key, PyString::new(py, &text))
            .map_err(|e| ReplError::internal("building a directory context", e))?;
    }
    meta.bytes = bytes;
    meta.chars = Some(sizes.iter().sum());
    meta.items = Some(sizes.len() as u64);
    meta.item_sizes = ItemSizes::from_sizes(sizes);
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

    #[test]
    fn formats_follow_extensions() {
        assert_eq!(file_format(Path::new("a.JSON")), FileFormat::Json);
        assert_eq!(
            file_format(Path::new("a.csv")),
            FileFormat::Table(TableFormat::Csv)
        );
        assert_eq!(file_format(Path::new("log")), FileFormat::Text);
        assert_eq!(
            file_format(Path::new("x.ndjson")),
            FileFormat::Table(TableFormat::NdJson)
        );
    }
}
