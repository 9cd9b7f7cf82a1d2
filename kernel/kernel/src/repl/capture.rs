//! Bounded capture of a block's stdout/stderr: the first half of the budget is kept from the
//! head, the second half from the tail, everything in between is counted and dropped. A cell
//! printing gigabytes holds at most `max_output_chars` characters (plus one chunk) in memory.
//!
//! Every write is redacted before it is kept (known secrets become `[redacted]`), so a
//! secret is never cut in half by the head/tail boundary and half of it kept.
//!
//! In a worker process the writer forwards instead ([`OutputSink`]): the parent keeps the
//! bounded, redacted capture, so output written before a crash is not lost with the worker.
//! The sink sends in batches (a write waits a few milliseconds for the next ones), so a write
//! the moment before a crash could still be; what the code flushes (`print(..., flush=True)`,
//! `sys.stdout.flush()`) is sent before the flush returns.

use std::sync::{Arc, Mutex};

use bridge::Redactor;
use pyo3::prelude::*;
use serde::{Deserialize, Serialize};

/// One of a block's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// Where a worker's block output goes (to its parent), written as the code writes it.
pub(crate) trait OutputSink: Send + Sync + std::fmt::Debug {
    fn write(&self, stream: Stream, text: &str);

    /// Sends what was written and not yet sent, before returning.
    fn flush(&self);
}

/// Head-and-tail character buffer.
#[derive(Debug)]
pub(crate) struct BoundedText {
    head: String,
    head_chars: usize,
    head_limit: usize,
    /// Tail window; may hold up to twice `tail_limit` before it is trimmed (amortised O(1)).
    tail: String,
    tail_chars: usize,
    tail_limit: usize,
    total_chars: usize,
}

/// The captured text of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) text: String,
    pub(crate) omitted_chars: usize,
}

impl BoundedText {
    pub(crate) fn new(max_chars: usize) -> Self {
        let head_limit = max_chars / 2;
        Self {
            head: String::new(),
            head_chars: 0,
            head_limit,
            tail: String::new(),
            tail_chars: 0,
            tail_limit: max_chars - head_limit,
            total_chars: 0,
        }
    }

    pub(crate) fn push(&mut self, s: &str) {
        let mut rest = s;
        if self.head_chars < self.head_limit {
            let room = self.head_limit - self.head_chars;
            let split = byte_index_of_char(rest, room);
            let (head, tail) = rest.split_at(split);
            let n = head.chars().count();
            self.head.push_str(head);
            self.head_chars += n;
            self.total_chars += n;
            rest = tail;
        }
        if rest.is_empty() {
            return;
        }
        let n = rest.chars().count();
        self.total_chars += n;
        if self.tail_limit == 0 {
            return;
        }
        if n >= self.tail_limit {
            let skip = n - self.tail_limit;
            self.tail.clear();
            self.tail.push_str(&rest[byte_index_of_char(rest, skip)..]);
            self.tail_chars = self.tail_limit;
            return;
        }
        self.tail.push_str(rest);
        self.tail_chars += n;
        if self.tail_chars > 2 * self.tail_limit {
            let skip = self.tail_chars - self.tail_limit;
            let cut = byte_index_of_char(&self.tail, skip);
            self.tail.drain(..cut);
            self.tail_chars = self.tail_limit;
        }
    }

    /// The kept text; when something was dropped, a marker line sits where it was.
    pub(crate) fn finish(self) -> Captured {
        let kept_tail = self.tail_chars.min(self.tail_limit);
        let omitted = self.total_chars - self.head_chars - kept_tail;
        let tail = if self.tail_chars > self.tail_limit {
            &self.tail[byte_index_of_char(&self.tail, self.tail_chars - self.tail_limit)..]
        } else {
            &self.tail[..]
        };
        let mut text = self.head;
        if omitted > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[... {omitted} characters omitted ...]\n"));
        }
        text.push_str(tail);
        Captured {
            text,
            omitted_chars: omitted,
        }
    }
}

/// Byte index of the `n`-th character of `s` (or `s.len()`).
fn byte_index_of_char(s: &str, n: usize) -> usize {
    if n >= s.len() {
        return s.len();
    }
    if s.is_ascii() {
        return n;
    }
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// The Python-visible writer behind one stream of one block (`write(str) -> int`).
#[pyclass(frozen, module = "_rlm_kernel")]
#[derive(Debug)]
pub(crate) struct OutputCapture {
    text: Mutex<Option<BoundedText>>,
    redactor: Redactor,
    /// Set in a worker: writes go there, and this capture keeps nothing.
    forward: Option<(Stream, Arc<dyn OutputSink>)>,
}

impl OutputCapture {
    pub(crate) fn new(max_chars: usize, redactor: Redactor) -> Self {
        Self {
            text: Mutex::new(Some(BoundedText::new(max_chars))),
            redactor,
            forward: None,
        }
    }

    /// A writer that hands every write to `sink` (a worker's link to its parent).
    pub(crate) fn forwarding(stream: Stream, sink: Arc<dyn OutputSink>) -> Self {
        Self {
            text: Mutex::new(None),
            redactor: Redactor::default(),
            forward: Some((stream, sink)),
        }
    }

    /// Take the captured text (later writes are dropped).
    pub(crate) fn take(&self) -> Captured {
        let taken = match self.text.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        taken.map_or(
            Captured {
                text: String::new(),
                omitted_chars: 0,
            },
            BoundedText::finish,
        )
    }

    pub(crate) fn push(&self, s: &str) {
        if let Some((stream, sink)) = &self.forward {
            sink.write(*stream, s);
            return;
        }
        let s = self.redactor.redact(s);
        let mut guard = match self.text.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(text) = guard.as_mut() {
            text.push(&s);
        }
    }
}

#[pymethods]
impl OutputCapture {
    fn write(&self, s: &str) -> usize {
        self.push(s);
        s.chars().count()
    }

    fn flush(&self) {
        if let Some((_, sink)) = &self.forward {
            sink.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(max: usize, writes: &[&str]) -> Captured {
        let mut b = BoundedText::new(max);
        for w in writes {
            b.push(w);
        }
        b.finish()
    }

    #[test]
    fn small_output_is_kept_whole() {
        let c = capture(100, &["hello ", "world\n"]);
        assert_eq!(c.text, "hello world\n");
        assert_eq!(c.omitted_chars, 0);
    }

    #[test]
    fn keeps_head_and_tail_and_counts_the_middle() {
        let c = capture(10, &["0123456789", "abcdefghij", "ABCDEFGHIJ"]);
        assert_eq!(c.omitted_chars, 20);
        assert_eq!(c.text, "01234\n[... 20 characters omitted ...]\nFGHIJ");
    }

    #[test]
    fn many_small_writes_stay_bounded() {
        let mut b = BoundedText::new(8);
        for i in 0..100_000 {
            b.push(&format!("{}", i % 10));
            assert!(b.tail.len() <= 2 * 4 + 1);
        }
        let c = b.finish();
        assert_eq!(c.omitted_chars, 100_000 - 8);
        assert!(c.text.starts_with("0123\n"), "{}", c.text);
        assert!(c.text.ends_with("6789"), "{}", c.text);
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let c = capture(4, &["ééééé", "ü€😀😀😀"]);
        assert_eq!(c.omitted_chars, 6);
        assert!(c.text.starts_with("éé\n"));
        assert!(c.text.ends_with("😀😀"));
    }

    #[test]
    fn a_secret_is_redacted_before_the_head_and_tail_cut() {
        let secret = "sk-capture-secret-0123456789";
        let capture = OutputCapture::new(20, Redactor::new([secret]));
        capture.push(&"x".repeat(5));
        // The secret would straddle the end of the 10-character head.
        capture.push(secret);
        capture.push(&"y".repeat(30));
        let c = capture.take();
        assert!(!c.text.contains("sk-capt"), "{}", c.text);
        assert!(c.text.starts_with("xxxxx[reda"), "{}", c.text);
    }

    #[test]
    fn zero_budget_counts_everything() {
        let c = capture(0, &["abc"]);
        assert_eq!(c.omitted_chars, 3);
        assert_eq!(c.text, "[... 3 characters omitted ...]\n");
    }
}
