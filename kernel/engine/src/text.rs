//! Text cut to size for a model: the head and the tail kept around the part left out, and
//! numbers grouped for reading.
//!
//! One cut serves every place that bounds text a model reads — the RLM loop's block output
//! and answers (through `kernel::rlm::truncate_middle`) and every tool result of the agent
//! loop — so the two never disagree on how much of a text they keep or how they count it
//! (characters, never splitting a code point).

use std::borrow::Cow;

/// A text cut to a limit: its head and tail, and how much was left out between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut<'t> {
    /// The first half of the characters kept.
    pub(crate) head: &'t str,
    /// The last half of the characters kept.
    pub(crate) tail: &'t str,
    /// Characters left out between them.
    pub(crate) omitted: usize,
    /// Characters of the whole text.
    pub(crate) total: usize,
}

/// `text` cut to `limit` characters (half from its head, half from its tail), or `None` when
/// it fits.
pub(crate) fn cut_middle(text: &str, limit: usize) -> Option<Cut<'_>> {
    // A text of no more bytes than the limit has no more characters either.
    if text.len() <= limit {
        return None;
    }
    let total = text.chars().count();
    if total <= limit {
        return None;
    }
    let head_chars = limit / 2;
    let tail_chars = limit - head_chars;
    let head_end = text
        .char_indices()
        .nth(head_chars)
        .map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(total - tail_chars)
        .map_or(text.len(), |(i, _)| i);
    Some(Cut {
        head: &text[..head_end],
        tail: &text[tail_start..],
        omitted: total - head_chars - tail_chars,
        total,
    })
}

/// Cuts `text` to at most `limit` characters plus a marker, keeping its head and tail.
///
/// The marker (`[... N characters omitted ...]` on its own line) is not counted in `limit`.
pub fn truncate_middle(text: &str, limit: usize) -> Cow<'_, str> {
    match cut_middle(text, limit) {
        None => Cow::Borrowed(text),
        Some(cut) => Cow::Owned(format!(
            "{}\n[... {} characters omitted ...]\n{}",
            cut.head,
            group_digits(cut.omitted as u64),
            cut.tail
        )),
    }
}

/// `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_middle_keeps_head_and_tail() {
        assert_eq!(truncate_middle("short", 10), "short");
        assert_eq!(truncate_middle("0123456789", 10), "0123456789");
        assert_eq!(
            truncate_middle("0123456789abcdef", 6),
            "012\n[... 10 characters omitted ...]\ndef"
        );
        // Characters, not bytes: never splits a code point.
        assert_eq!(
            truncate_middle("ééééé", 2),
            "é\n[... 3 characters omitted ...]\né"
        );
        assert_eq!(
            truncate_middle("ééééé", 5),
            "ééééé",
            "more bytes than the limit, but not more characters"
        );
        assert_eq!(
            truncate_middle("abc", 0),
            "\n[... 3 characters omitted ...]\n"
        );
    }

    #[test]
    fn truncated_text_is_bounded_for_any_input_size() {
        for size in [0, 1, 19_999, 20_000, 20_001, 1_000_000] {
            let text = "x".repeat(size);
            let cut = truncate_middle(&text, 20_000);
            assert!(cut.chars().count() <= 20_000 + 60, "size {size}");
        }
    }

    #[test]
    fn digits_are_grouped_by_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }
}
