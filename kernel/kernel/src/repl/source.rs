//! What a session is asked to load: each [`ContextInput`] is a [`ContextSource`] and an
//! optional variable name; [`LoadOptions`] say how tables and legacy text are read.
//!
//! Every context is `context_N` by position (`context` is the first); a named one is also
//! bound to its name. Names are checked before anything loads: a Python identifier, not a
//! keyword, not a builtin (shadowing `len` or `list` would break the model's code), not one of
//! the kernel's names, and each used once.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use serde::{Deserialize, Serialize};

use super::error::{NameProblem, ReplError};
use super::interpreter;
use super::metadata::FrameLibrary;

/// Names the kernel defines in every session (restored after a block that rebinds them);
/// `context_0 … context_n` and the contexts' own names are reserved too.
pub const RESERVED_NAMES: &[&str] = &[
    "context",
    "llm_query",
    "llm_query_batched",
    "rlm_query",
    "rlm_query_batched",
    "FINAL_VAR",
    "SHOW_VARS",
    "answer",
    "LlmQueryError",
];

/// Where a context comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextSource {
    /// A file (kind from its first bytes, then its extension) or a directory.
    Path(PathBuf),
    /// Standard input, read to the end as text (`-` on the command line).
    Stdin,
    /// Text given directly.
    Text(String),
    /// A Python object the caller already holds, bound into the session by reference.
    Object(LiveObject),
    /// A value an isolated session's code handed to an `rlm_query` child, serialised by its
    /// worker (made by the kernel, not by callers).
    Encoded(EncodedContext),
}

/// A value serialised by a worker for an `rlm_query` child (`children.rs`): a `dict`, `list`
/// or `tuple` as JSON, a polars frame as Parquet, a pandas frame as CSV. The session loads it
/// as it would a file of that format: the bytes are the worker's, untrusted, and malformed
/// ones fail the load with the error such a file gets.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedContext {
    /// How the metadata and errors name it (`…/rlm-child-context-<pid>-<n>.json`).
    pub(crate) source: String,
    /// How it was written.
    pub(crate) format: EncodedFormat,
    /// What was written (shared: a child's session, its start and its memfd take no copy).
    #[serde(with = "bytes")]
    pub(crate) bytes: Arc<Vec<u8>>,
}

impl fmt::Debug for EncodedContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedContext")
            .field("source", &self.source)
            .field("format", &self.format)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// How an [`EncodedContext`] was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EncodedFormat {
    /// UTF-8 JSON text (`json.dumps`), loaded as a `.json` file.
    Json,
    /// A Parquet file (`polars.DataFrame.write_parquet`), loaded as a `.parquet` file.
    Parquet,
    /// UTF-8 CSV text (`pandas.DataFrame.to_csv`), loaded as a `.csv` file.
    Csv,
}

impl EncodedFormat {
    /// The extension of a file of this format (`json`, `parquet`, `csv`).
    pub(crate) fn extension(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Parquet => "parquet",
            Self::Csv => "csv",
        }
    }
}

/// Bytes as MessagePack's `bin` (serde's default for a `Vec<u8>` is a list of numbers).
mod bytes {
    use std::sync::Arc;

    use serde::de::{Deserializer, Error, Visitor};
    use serde::ser::Serializer;

    pub(super) fn serialize<S: Serializer>(
        bytes: &Arc<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<Vec<u8>>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        deserializer.deserialize_byte_buf(Bytes).map(Arc::new)
    }
}

/// A live Python object used as a context: the session's `context` *is* this object (no
/// serialisation, no copy), so a frame of any size costs nothing to hand over. Supported: `str`,
/// `dict`, `list`, `polars.DataFrame`, `pandas.DataFrame`.
#[derive(Clone)]
pub struct LiveObject {
    pub(crate) object: Arc<Py<PyAny>>,
    pub(crate) label: String,
}

impl LiveObject {
    /// Wraps `object`; `label` names it in the prompt and errors (e.g. the variable name `df`).
    pub fn new(object: Py<PyAny>, label: impl Into<String>) -> Self {
        Self {
            object: Arc::new(object),
            label: label.into(),
        }
    }
}

impl fmt::Debug for LiveObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveObject")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Two live objects are equal when they are the same object under the same label.
impl PartialEq for LiveObject {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.object, &other.object) && self.label == other.label
    }
}

impl Eq for LiveObject {}

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

/// One context to load, with the variable name it gets besides `context_N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInput {
    /// The extra variable name, e.g. `sales` (checked by [`check_context_name`]).
    pub name: Option<String>,
    /// Where it comes from.
    pub source: ContextSource,
}

impl From<ContextSource> for ContextInput {
    fn from(source: ContextSource) -> Self {
        Self { name: None, source }
    }
}

/// How files are read into values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadOptions {
    /// Field separator of CSV files (one ASCII byte); `None` sniffs `,` `;` tab or `|` from
    /// the first lines (`.tsv` files: tab).
    pub csv_separator: Option<u8>,
    /// Leave out CSV rows with more fields than the header (counted in the metadata) instead
    /// of failing with the first one's line.
    pub skip_bad_rows: bool,
    /// Encoding of text files (text, JSON, CSV), a Python codec name such as `latin-1`,
    /// `cp1252` or `utf-16`; `None` reads UTF-8 without a copy.
    pub encoding: Option<String>,
    /// The library of the data frames tables become.
    pub frames: FrameLibrary,
}

/// Checks that `name` can name a context variable: a Python identifier, not a keyword, builtin
/// or kernel name (see [`ContextInput`]); starts the interpreter if needed.
pub fn check_context_name(name: &str) -> Result<(), ReplError> {
    let problem = |problem| ReplError::ContextName {
        name: name.to_owned(),
        problem,
    };
    if RESERVED_NAMES.contains(&name) || is_positional_name(name) {
        return Err(problem(NameProblem::Reserved));
    }
    interpreter::start()?;
    let found = Python::attach(|py| -> PyResult<Option<NameProblem>> {
        let text = pyo3::types::PyString::new(py, name);
        if !text.call_method0("isidentifier")?.is_truthy()? {
            return Ok(Some(NameProblem::NotIdentifier));
        }
        if py
            .import("keyword")?
            .call_method1("iskeyword", (&text,))?
            .is_truthy()?
        {
            return Ok(Some(NameProblem::Keyword));
        }
        if py.import("builtins")?.hasattr(&text)? {
            return Ok(Some(NameProblem::Builtin));
        }
        Ok(None)
    })
    .map_err(|e| ReplError::internal("checking a context name", e))?;
    found.map_or(Ok(()), |p| Err(problem(p)))
}

/// `context_0`, `context_12`, …
fn is_positional_name(name: &str) -> bool {
    name.strip_prefix("context_")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Checks that `encoding` names a Python codec; starts the interpreter if needed.
pub fn check_encoding(encoding: &str) -> Result<(), ReplError> {
    codec_name(encoding).map(drop)
}

/// The codec's canonical name, e.g. `iso8859-1` for `latin-1`.
fn codec_name(encoding: &str) -> Result<String, ReplError> {
    interpreter::start()?;
    Python::attach(|py| {
        match interpreter::interpreter(py)?
            .support(py)
            .call_method1("encoding_name", (encoding,))
            .and_then(|n| n.extract::<String>())
        {
            Ok(name) => Ok(name),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyLookupError>(py) => {
                Err(ReplError::UnknownEncoding {
                    encoding: encoding.to_owned(),
                })
            }
            Err(e) => Err(ReplError::internal("looking up a text encoding", e)),
        }
    })
}

impl LoadOptions {
    /// These options with the encoding checked and made canonical, `None` for UTF-8 (read
    /// by the copy-free loader).
    pub(crate) fn resolved(&self) -> Result<Self, ReplError> {
        let encoding = match &self.encoding {
            None => None,
            Some(name) => Some(codec_name(name)?).filter(|n| n != "utf-8"),
        };
        Ok(Self {
            encoding,
            ..self.clone()
        })
    }
}

/// Checks every name of `inputs`, and that none is used twice.
pub(crate) fn check_names(inputs: &[ContextInput]) -> Result<(), ReplError> {
    let mut seen = std::collections::HashSet::new();
    for name in inputs.iter().filter_map(|i| i.name.as_deref()) {
        check_context_name(name)?;
        if !seen.insert(name) {
            return Err(ReplError::ContextName {
                name: name.to_owned(),
                problem: NameProblem::Duplicate,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positional_names_are_recognised() {
        assert!(is_positional_name("context_0"));
        assert!(is_positional_name("context_12"));
        assert!(!is_positional_name("context_"));
        assert!(!is_positional_name("context_x"));
        assert!(!is_positional_name("contexts"));
    }
}
