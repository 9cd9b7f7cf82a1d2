//! Finding the code a model wants to run: fenced blocks tagged `repl`.
//!
//! One pattern marks runnable code, ```` ```repl\s*\n(.*?)\n``` ```` with `.` matching
//! newlines: a fence tagged `repl`, optional whitespace, a newline, the code (non-greedy, may
//! span lines), a newline and the closing fence. It is matched by hand ([`repl_blocks`]), not
//! by a regex engine: a reply is parsed once, cold, right after its model call, and the engine
//! took ~10-20 us (its caches, first touched on that thread) where the hand-written scan takes
//! ~1-3. A property test holds the two to the same matches on any reply.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// One ```` ```repl ```` block of a model reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeBlock {
    /// Position among the reply's `repl` blocks, from 0.
    pub index: usize,
    /// The code between the fences.
    pub code: String,
}

/// Extracts every ```` ```repl ```` block of `reply`, in order.
///
/// Uses exactly the pattern ```` ```repl\s*\n(.*?)\n``` ```` with `.` matching newlines; fences
/// with any other tag (```` ```python ````, a bare ```` ``` ````) are not runnable code.
pub fn extract_code_blocks(reply: &str) -> Vec<CodeBlock> {
    extract_counting(reply, &mut 0)
}

/// [`extract_code_blocks`], adding to `work` the bytes its searches examined: at most three
/// times the length of the reply ([`repl_blocks`]).
pub(crate) fn extract_counting(reply: &str, work: &mut usize) -> Vec<CodeBlock> {
    repl_blocks(reply, work)
        .enumerate()
        .map(|(index, found)| CodeBlock {
            index,
            code: reply[found.code].to_owned(),
        })
        .collect()
}

/// `reply` with every `repl` block replaced by a blank line, so that code is never read as
/// prose (a `FINAL(...)` inside a block is code, not a final-answer line).
pub(crate) fn prose_outside_blocks(reply: &str) -> String {
    let mut prose = String::with_capacity(reply.len());
    let mut from = 0;
    for found in repl_blocks(reply, &mut 0) {
        prose.push_str(&reply[from..found.whole.start]);
        prose.push('\n');
        from = found.whole.end;
    }
    prose.push_str(&reply[from..]);
    prose
}

/// The tag that opens runnable code, and the line that closes it.
const OPEN: &str = "```repl";
const CLOSE: &str = "\n```";

/// Where one `repl` block lies in a reply: the whole match, and its code.
struct Found {
    whole: Range<usize>,
    code: Range<usize>,
}

/// The matches of ```` ```repl\s*\n(.*?)\n``` ```` in `reply`, leftmost first, as a regex
/// engine finds them (`\s` is Unicode whitespace, as [`char::is_whitespace`]).
///
/// After the tag, `\s*` runs greedily over the whitespace that follows and gives back to its
/// last newline; `(.*?)` then ends at the first closing line after that newline. With none
/// there, the pattern gives back one newline more: a closing line may start at the run's last
/// newline, the code being what lies between it and the newline before (no other closing line
/// can start within the whitespace). With neither, no closing line follows, and no later tag
/// can match.
///
/// `work` grows by the bytes each search examines: every part of the reply is searched for the
/// tag at most once and for the closing line at most once, and a run of whitespace at most three
/// times more; hence at most three times the length of the reply.
fn repl_blocks<'a>(reply: &'a str, work: &'a mut usize) -> impl Iterator<Item = Found> + 'a {
    let mut from = 0;
    std::iter::from_fn(move || {
        loop {
            let rest = reply.get(from..)?;
            let Some(at) = rest.find(OPEN) else {
                *work += rest.len();
                return None;
            };
            *work += at + OPEN.len();
            let start = from + at;
            let tagged = start + OPEN.len();
            let after = &reply[tagged..];
            let run = after
                .find(|c: char| !c.is_whitespace())
                .map_or(after, |end| &after[..end]);
            // Scanned, then searched backwards for its last newline.
            *work += 2 * run.len();
            // A backtick is not whitespace: the next tag starts after the run.
            from = tagged + run.len();
            let Some(last) = run.rfind('\n') else {
                continue;
            };
            let code_start = tagged + last + 1;
            let searched = &reply[code_start..];
            if let Some(close) = searched.find(CLOSE) {
                *work += close + CLOSE.len();
                from = code_start + close + CLOSE.len();
                return Some(Found {
                    whole: start..from,
                    code: code_start..code_start + close,
                });
            }
            *work += searched.len() + last;
            from = reply.len() + 1;
            let before = run[..last].rfind('\n')?;
            if !reply[tagged + last..].starts_with(CLOSE) {
                return None;
            }
            return Some(Found {
                whole: start..tagged + last + CLOSE.len(),
                code: tagged + before + 1..tagged + last,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(reply: &str) -> Vec<String> {
        extract_code_blocks(reply)
            .into_iter()
            .map(|b| b.code)
            .collect()
    }

    #[test]
    fn extracts_blocks_in_order_with_indices() {
        let reply =
            "Look first.\n```repl\nprint(len(context))\n```\nthen\n```repl\nx = 1\ny = 2\n```\n";
        let blocks = extract_code_blocks(reply);
        assert_eq!(
            blocks,
            vec![
                CodeBlock {
                    index: 0,
                    code: "print(len(context))".into()
                },
                CodeBlock {
                    index: 1,
                    code: "x = 1\ny = 2".into()
                },
            ]
        );
    }

    #[test]
    fn table_of_fence_shapes() {
        let cases: &[(&str, &[&str])] = &[
            ("no code at all", &[]),
            ("```python\nprint(1)\n```", &[]),
            ("```\nprint(1)\n```", &[]),
            ("```py\nprint(1)\n```", &[]),
            ("```replx\nprint(1)\n```", &[]),
            // Trailing spaces after the tag are allowed by `\s*`.
            ("```repl   \nprint(1)\n```", &["print(1)"]),
            // `\s*` also swallows blank lines before the code.
            ("```repl\n\n\nprint(1)\n```", &["print(1)"]),
            // The closing fence must start a line.
            ("```repl\nprint(1)```", &[]),
            ("```repl\nprint(1)```\nmore\n```", &["print(1)```\nmore"]),
            // Non-greedy: two blocks stay two blocks.
            ("```repl\na\n```\n```repl\nb\n```", &["a", "b"]),
            // An unclosed block is not run.
            ("```repl\nprint(1)\n", &[]),
            // Indented code keeps its indentation.
            (
                "```repl\nfor i in range(2):\n    print(i)\n```",
                &["for i in range(2):\n    print(i)"],
            ),
            // A mixed reply runs only the repl block.
            ("```python\nbad()\n```\n```repl\ngood()\n```", &["good()"]),
            // The closing fence may carry text after it (e.g. ```` ```\n ````).
            ("```repl\nx\n```text after", &["x"]),
            // The whitespace after the tag gives back its last newline to close the block.
            ("```repl\n\n```", &[""]),
            ("```repl \n\t\n```", &["\t"]),
            // ... and only that one.
            ("```repl\n\n \n```", &[" "]),
            ("```repl\n\n ```", &[]),
            // Unicode whitespace counts as `\s`.
            ("```repl\u{a0}\u{2003}\nx\n```", &["x"]),
        ];
        for (reply, want) in cases {
            assert_eq!(
                codes(reply),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "reply: {reply:?}"
            );
        }
    }

    #[test]
    fn prose_outside_blocks_blanks_code() {
        let reply = "before\n```repl\nFINAL(1)\n```\nafter";
        assert_eq!(prose_outside_blocks(reply), "before\n\n\nafter");
    }
}
