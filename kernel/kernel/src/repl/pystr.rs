//! A UTF-8 file streamed into a Python `str` with no second copy of the text in memory.
//!
//! Reading the file into a Rust `String` and handing it to `PyUnicode_FromStringAndSize` peaks
//! at twice the file size (both copies live at once). Instead, pass 1 streams the file in
//! [`CHUNK`]-sized pieces to validate UTF-8, count characters and find the widest one; then
//! `PyUnicode_New` allocates the final `str` in its PEP 393 layout (1, 2 or 4 bytes per
//! character) and pass 2 streams the file again, writing each piece straight into that buffer.
//! Peak memory is the `str` plus one chunk; the second read comes from the page cache. A
//! compressed file is decompressed on each pass, so the same bound holds for `.txt.gz`.
//!
//! Safety rests on checks against what pass 1 measured: pass 2 reads exactly the bytes pass 1
//! read (a file still being appended to loads as it was), every write is bounds- and
//! width-checked, and the widest character must be met again, so a file rewritten between
//! the passes yields an error, never a malformed `str`.
//!
//! Under the stable ABI (`Py_LIMITED_API`, the Python package's abi3 build) a `str` cannot be
//! written in place; there pass 2 collects the text in Rust and Python copies it once.

use std::io::Read;
use std::path::Path;

#[cfg(not(Py_LIMITED_API))]
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::detect::{open_decoded, read_error};
use super::error::ReplError;
use super::metadata::Compression;

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// What pass 1 learned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Shape {
    bytes: u64,
    chars: u64,
    max_char: u32,
}

/// Where the text comes from: a file, read through its compression.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextFile<'a> {
    pub(crate) path: &'a Path,
    pub(crate) compression: Option<Compression>,
}

impl TextFile<'_> {
    fn open(&self) -> Result<Box<dyn Read>, ReplError> {
        open_decoded(self.path, self.compression).map_err(|e| self.error(e))
    }

    fn error(&self, source: std::io::Error) -> ReplError {
        read_error(self.path, self.compression, source)
    }
}

/// Reads `file` into a new `str`; returns it with its length in characters.
#[cfg(not(Py_LIMITED_API))]
pub(crate) fn read_file_as_str<'py>(
    py: Python<'py>,
    file: TextFile<'_>,
    hint: &str,
) -> Result<(Bound<'py, PyString>, u64), ReplError> {
    let path = file.path;
    let shape = measure(file, hint)?;
    let size = ffi::Py_ssize_t::try_from(shape.chars).map_err(|_| {
        ReplError::internal(
            "loading a text context",
            format!(
                "`{}` has more characters than a Python str can hold",
                path.display()
            ),
        )
    })?;
    // SAFETY: plain allocation call with the GIL held; a NULL result is checked below.
    let raw = unsafe { ffi::PyUnicode_New(size, shape.max_char) };
    if raw.is_null() {
        let err = PyErr::fetch(py);
        return Err(ReplError::internal("allocating a text context", err));
    }
    // SAFETY: `raw` is a new, owned, non-NULL reference to a `str`.
    let text = unsafe { Bound::from_owned_ptr(py, raw).cast_into_unchecked::<PyString>() };
    fill(&text, file, shape, hint)?;
    Ok((text, shape.chars))
}

/// Reads `file` into a new `str` through a Rust `String` (the stable ABI has no `str` to fill).
#[cfg(Py_LIMITED_API)]
pub(crate) fn read_file_as_str<'py>(
    py: Python<'py>,
    file: TextFile<'_>,
    hint: &str,
) -> Result<(Bound<'py, PyString>, u64), ReplError> {
    let shape = measure(file, hint)?;
    let mut text = String::with_capacity(usize::try_from(shape.bytes).unwrap_or(0));
    stream_utf8(file, hint, shape.bytes, |piece| {
        text.push_str(piece);
        Ok(())
    })?;
    Ok((PyString::new(py, &text), shape.chars))
}

/// Streams the first `limit` bytes of `file` (all of it for `u64::MAX`) as UTF-8, calling
/// `each` on every complete piece of text in order; returns the bytes read.
fn stream_utf8(
    source: TextFile<'_>,
    hint: &str,
    limit: u64,
    mut each: impl FnMut(&str) -> Result<(), ReplError>,
) -> Result<u64, ReplError> {
    let read_err = |e| source.error(e);
    let mut file = source.open()?.take(limit);
    let mut buf = vec![0u8; CHUNK + 4];
    let mut carry = 0usize;
    let mut consumed = 0usize;
    loop {
        let read = read_full(&mut file, &mut buf[carry..carry + CHUNK]).map_err(read_err)?;
        let len = carry + read;
        if read == 0 {
            if carry > 0 {
                return Err(not_utf8(source, consumed, hint));
            }
            return Ok(consumed as u64);
        }
        let valid = match std::str::from_utf8(&buf[..len]) {
            Ok(_) => len,
            // A sequence cut by the chunk boundary: finish it with the next read.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(e) => return Err(not_utf8(source, consumed + e.valid_up_to(), hint)),
        };
        // SAFETY: `from_utf8` accepted exactly these bytes.
        each(unsafe { std::str::from_utf8_unchecked(&buf[..valid]) })?;
        consumed += valid;
        buf.copy_within(valid..len, 0);
        carry = len - valid;
    }
}

/// Fills `buf` from `file` until it is full or the file ends; returns the bytes read.
fn read_full(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Pass 1: validate, count characters, find the widest.
fn measure(file: TextFile<'_>, hint: &str) -> Result<Shape, ReplError> {
    let mut shape = Shape::default();
    shape.bytes = stream_utf8(file, hint, u64::MAX, |piece| {
        if piece.is_ascii() {
            shape.chars += piece.len() as u64;
            if !piece.is_empty() {
                shape.max_char = shape.max_char.max(0x7f);
            }
        } else {
            for c in piece.chars() {
                shape.chars += 1;
                shape.max_char = shape.max_char.max(c as u32);
            }
        }
        Ok(())
    })?;
    Ok(shape)
}

/// Pass 2: write the text into the `str`'s buffer.
#[cfg(not(Py_LIMITED_API))]
fn fill(
    text: &Bound<'_, PyString>,
    file: TextFile<'_>,
    shape: Shape,
    hint: &str,
) -> Result<(), ReplError> {
    let path = file.path;
    let ptr = text.as_ptr();
    // SAFETY: `ptr` is a live, freshly allocated compact `str`.
    let (kind, data) = unsafe { (ffi::PyUnicode_KIND(ptr), ffi::PyUnicode_DATA(ptr)) };
    let changed = || ReplError::ContextRead {
        path: path.to_owned(),
        error: std::io::Error::other("the file changed while it was being loaded; load it again"),
    };
    let total = usize::try_from(shape.chars).map_err(|_| changed())?;
    let mut at = 0usize;
    let mut widest = 0u32;
    let bytes = stream_utf8(file, hint, shape.bytes, |piece| {
        if kind == ffi::PyUnicode_1BYTE_KIND && piece.is_ascii() {
            if at + piece.len() > total {
                return Err(changed());
            }
            // SAFETY: `at + len <= total` characters of 1 byte each fit the buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    data.cast::<u8>().add(at),
                    piece.len(),
                );
            }
            at += piece.len();
            if !piece.is_empty() {
                widest = widest.max(0x7f);
            }
            return Ok(());
        }
        for c in piece.chars() {
            let code = c as u32;
            widest = widest.max(code);
            if at >= total || code > shape.max_char {
                return Err(changed());
            }
            // SAFETY: `at < total`, and `code <= max_char` fits the width `PyUnicode_New`
            // chose for `max_char`.
            unsafe {
                match kind {
                    ffi::PyUnicode_1BYTE_KIND => *data.cast::<u8>().add(at) = code as u8,
                    ffi::PyUnicode_2BYTE_KIND => *data.cast::<u16>().add(at) = code as u16,
                    _ => *data.cast::<u32>().add(at) = code,
                }
            }
            at += 1;
        }
        Ok(())
    })?;
    // PEP 393 requires the layout to match the widest character actually stored.
    if bytes != shape.bytes || at != total || widest != shape.max_char {
        return Err(changed());
    }
    Ok(())
}

fn not_utf8(file: TextFile<'_>, offset: usize, hint: &str) -> ReplError {
    ReplError::ContextNotUtf8 {
        path: file.path.to_owned(),
        offset,
        line: line_of(file, offset),
        hint: hint.to_owned(),
    }
}

/// 1-based line of byte `offset` (read again: only on the error path).
fn line_of(source: TextFile<'_>, offset: usize) -> usize {
    let Ok(file) = source.open() else {
        return 0;
    };
    let mut lines = 1;
    let mut left = offset;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = match reader.read(&mut buf[..left.min(1 << 16)]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
        left -= n;
    }
    lines
}

#[cfg(all(test, not(Py_LIMITED_API)))]
mod tests {
    use super::*;

    fn plain(path: &Path) -> TextFile<'_> {
        TextFile {
            path,
            compression: None,
        }
    }

    fn load(bytes: &[u8]) -> Result<(String, u64), ReplError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.txt");
        std::fs::write(&path, bytes).expect("write");
        Python::initialize();
        Python::attach(|py| {
            let (s, chars) = read_file_as_str(py, plain(&path), "")?;
            Ok((s.to_str().expect("valid str").to_owned(), chars))
        })
    }

    #[test]
    fn every_width_round_trips() {
        for text in [
            "",
            "plain ascii\n",
            "café Ünïcode",
            "mixed ☃ snowman",
            "emoji 🦀 and ascii",
        ] {
            let (back, chars) = load(text.as_bytes()).expect("loads");
            assert_eq!(back, text);
            assert_eq!(chars, text.chars().count() as u64);
        }
    }

    #[test]
    fn pieces_cut_inside_a_character_round_trip() {
        // Multi-byte characters straddle the chunk boundaries.
        let mut text = "a".repeat(CHUNK - 1);
        text.push('🦀');
        text.push_str(&"é".repeat(CHUNK / 2 + 3));
        text.push_str("end");
        let (back, chars) = load(text.as_bytes()).expect("loads");
        assert!(back == text, "round trip");
        assert_eq!(chars, text.chars().count() as u64);
    }

    #[test]
    fn a_file_changed_between_the_passes_is_an_error_or_loads_as_measured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.txt");
        Python::initialize();
        let fill_after = |first: &str, then: &str| {
            std::fs::write(&path, first).expect("write");
            let shape = measure(plain(&path), "").expect("measures");
            std::fs::write(&path, then).expect("rewrite");
            Python::attach(|py| {
                let size = ffi::Py_ssize_t::try_from(shape.chars).expect("size");
                // SAFETY: as in `read_file_as_str`.
                let text = unsafe {
                    Bound::from_owned_ptr(py, ffi::PyUnicode_New(size, shape.max_char))
                        .cast_into_unchecked::<PyString>()
                };
                fill(&text, plain(&path), shape, "").map(|()| text.to_string())
            })
        };
        // Same length, narrower text: the layout would not match, so it is refused.
        assert!(fill_after("ab☃", "abc").is_err());
        assert!(fill_after("abc", "ab☃").is_err());
        assert!(fill_after("abcdef", "abc").is_err(), "truncated");
        // Appended to (a live log): loads what pass 1 measured.
        assert_eq!(fill_after("abc", "abc and more").expect("loads"), "abc");
    }

    #[test]
    fn invalid_utf8_names_offset_and_line() {
        let Err(ReplError::ContextNotUtf8 { offset, line, .. }) = load(b"ok\nfine\n\xff bad")
        else {
            panic!("not UTF-8");
        };
        assert_eq!((offset, line), (8, 3));
        let Err(ReplError::ContextNotUtf8 { offset, .. }) =
            load("cut 🦀".as_bytes().split_last().expect("bytes").1)
        else {
            panic!("truncated sequence at the end");
        };
        assert_eq!(offset, 4);
    }
}
