//! Contexts on their way to a worker: files go as paths (the worker reads them itself), the
//! rest once into a sealed memfd the worker maps — text given directly, standard input, the
//! values a parent's worker serialised for an `rlm_query` child (JSON, Parquet, CSV), and
//! live objects of the Python package (`share.py` writes and reads those). The memfds are
//! kept for the session's life: a fresh worker after a crash maps the same ones.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::protocol::{MAX_MEMFDS, MemfdContent, ObjectFormat, WireContext, WireSource};
use crate::repl::context::{describe_json, describe_text};
use crate::repl::error::ReplError;
use crate::repl::metadata::ContextMetadata;
use crate::repl::source::{ContextInput, ContextSource, EncodedFormat, LiveObject};

const SHARE_SOURCE: &str = include_str!("share.py");

/// The source a text given directly has in its metadata.
const TEXT_SOURCE: &str = "<text>";

/// What the worker's [`Ready`](super::protocol::FromWorker::Ready) will say of `inputs`,
/// known here from what rlm hands over, when it is: the memfd holds these bytes, sealed, and
/// the worker describes them by the same function — for texts given directly, and for a
/// child's JSON that Python's parser surely accepts ([`describe_json`]). `None` when a
/// context must be loaded to be described (a file, standard input, a live object, a child's
/// frame, JSON that only Python can judge).
pub(crate) fn described_ahead(inputs: &[ContextInput]) -> Option<Vec<ContextMetadata>> {
    inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let started = std::time::Instant::now();
            let mut meta = match &input.source {
                ContextSource::Text(text) => Some(describe_text(index, input, TEXT_SOURCE, text)),
                ContextSource::Encoded(encoded) => match encoded.format {
                    EncodedFormat::Json => describe_json(index, input, encoded),
                    EncodedFormat::Parquet | EncodedFormat::Csv => None,
                },
                ContextSource::Path(_) | ContextSource::Stdin | ContextSource::Object(_) => None,
            }?;
            meta.load_ms = started.elapsed().as_secs_f64() * 1000.0;
            Some(meta)
        })
        .collect()
}

/// What a worker's contexts need: their descriptions, the memfds (kept for every restart,
/// handed over with each start frame), and the paths the worker must be allowed to read.
#[derive(Debug)]
pub(crate) struct SharedContexts {
    pub(crate) contexts: Vec<WireContext>,
    pub(crate) memfds: Vec<OwnedFd>,
    pub(crate) read_paths: Vec<PathBuf>,
}

/// Prepares `inputs` for workers: reads standard input, writes text and live objects into
/// memfds.
pub(crate) fn share_contexts(inputs: &[ContextInput]) -> Result<SharedContexts, ReplError> {
    let mut shared = SharedContexts {
        contexts: Vec::with_capacity(inputs.len()),
        memfds: Vec::new(),
        read_paths: Vec::new(),
    };
    for input in inputs {
        let source = match &input.source {
            ContextSource::Path(path) => {
                shared.read_paths.push(readable(path));
                WireSource::Path(path.clone())
            }
            ContextSource::Text(text) => {
                let memfd = memfd("text").map_err(|e| shared_memory_error(&e))?;
                write_all(&memfd, text.as_bytes()).map_err(|e| shared_memory_error(&e))?;
                shared.add(
                    memfd,
                    MemfdContent::Text {
                        source: TEXT_SOURCE.to_owned(),
                    },
                )?
            }
            ContextSource::Encoded(encoded) => {
                let memfd = memfd("encoded").map_err(|e| shared_memory_error(&e))?;
                write_all(&memfd, &encoded.bytes).map_err(|e| shared_memory_error(&e))?;
                shared.add(
                    memfd,
                    MemfdContent::Encoded {
                        source: encoded.source.clone(),
                        format: encoded.format,
                    },
                )?
            }
            ContextSource::Stdin => {
                let memfd = memfd("stdin").map_err(|e| shared_memory_error(&e))?;
                let mut file = File::from(
                    memfd
                        .try_clone()
                        .map_err(|source| ReplError::ContextStdin { source })?,
                );
                std::io::copy(&mut std::io::stdin().lock(), &mut file)
                    .map_err(|source| ReplError::ContextStdin { source })?;
                shared.add(
                    memfd,
                    MemfdContent::Text {
                        source: "-".to_owned(),
                    },
                )?
            }
            ContextSource::Object(live) => {
                let memfd = memfd("object").map_err(|e| shared_memory_error(&e))?;
                let format = export_object(live, &memfd)?;
                shared.add(
                    memfd,
                    MemfdContent::Object {
                        label: live.label.clone(),
                        format,
                    },
                )?
            }
        };
        shared.contexts.push(WireContext {
            name: input.name.clone(),
            source,
        });
    }
    Ok(shared)
}

impl SharedContexts {
    /// Seals `memfd` and keeps it as the next one handed over.
    fn add(&mut self, memfd: OwnedFd, content: MemfdContent) -> Result<WireSource, ReplError> {
        if self.memfds.len() == MAX_MEMFDS {
            return Err(ReplError::Worker {
                problem: format!(
                    "takes at most {MAX_MEMFDS} contexts held in memory; pass files or fewer objects"
                ),
            });
        }
        seal(&memfd).map_err(|e| shared_memory_error(&e))?;
        let index = self.memfds.len();
        self.memfds.push(memfd);
        Ok(WireSource::Memfd { index, content })
    }
}

/// The path to allow reading: the file itself (canonical, symlinks resolved), or as given
/// when it cannot be resolved (the worker then reports it missing). The empty path (the
/// folder of a file named without one, e.g. `steps.py` of a workflow run as `flow.yaml`) is
/// the working directory.
pub(crate) fn readable(path: &Path) -> PathBuf {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| std::path::absolute(path).unwrap_or_else(|_| path.to_owned()))
}

fn shared_memory_error(e: &std::io::Error) -> ReplError {
    ReplError::Worker {
        problem: format!("could not be handed a context through shared memory: {e}"),
    }
}

fn memfd(name: &str) -> std::io::Result<OwnedFd> {
    let name = CString::new(format!("rlm-context-{name}")).map_err(std::io::Error::other)?;
    // SAFETY: memfd_create with a valid C string; the result is a new descriptor or -1.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn write_all(memfd: &OwnedFd, bytes: &[u8]) -> std::io::Result<()> {
    File::from(memfd.try_clone()?).write_all(bytes)
}

/// No more writes, growth or shrinking: what the worker maps stays what the host wrote.
fn seal(memfd: &OwnedFd) -> std::io::Result<()> {
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on an open descriptor.
    if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes a live object into `memfd` through `share.py` (in the host's interpreter).
fn export_object(live: &LiveObject, memfd: &OwnedFd) -> Result<ObjectFormat, ReplError> {
    Python::attach(|py| {
        let format: String = share_module(py)
            .and_then(|share| {
                share
                    .call_method1("export_shared", (live.object.bind(py), memfd.as_raw_fd()))?
                    .extract()
            })
            .map_err(|e| {
                // Ctrl-C in the host's Python (a pickling that takes long): an interrupt, as
                // Python would raise it, not a worker's failure.
                if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                    ReplError::Interrupted {
                        action: format!(
                            "handing the context `{}` to the worker process",
                            live.label
                        ),
                    }
                } else {
                    ReplError::Worker {
                        problem: format!("could not be handed the context `{}`: {e}", live.label),
                    }
                }
            })?;
        match format.as_str() {
            "text" => Ok(ObjectFormat::Text),
            "bytes" => Ok(ObjectFormat::Bytes),
            "arrow_ipc" => Ok(ObjectFormat::ArrowIpc),
            "pickle" => Ok(ObjectFormat::Pickle),
            other => Err(ReplError::internal("sharing a live context", other)),
        }
    })
}

/// `share.py`, loaded once per interpreter (host or worker).
pub(crate) fn share_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static SHARE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    SHARE
        .get_or_try_init(py, || {
            let source = CString::new(SHARE_SOURCE)?;
            PyModule::from_code(py, &source, c"<rlm-kernel>", c"_rlm_share").map(Bound::unbind)
        })
        .map(|module| module.bind(py))
}
