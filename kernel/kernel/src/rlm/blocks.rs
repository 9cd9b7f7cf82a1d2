//! Finding the code a model wants to run: fenced blocks tagged `repl`.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::repl::ExecutionResult;

/// The one pattern that marks runnable code: a fence tagged `repl`, optional whitespace, a
/// newline, the code (non-greedy, may span lines), a newline and the closing fence.
static REPL_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // A literal pattern; covered by every test in this module.
    Regex::new(r"(?s)```repl\s*\n(.*?)\n```").unwrap()
});

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
    REPL_BLOCK
        .captures_iter(reply)
        .enumerate()
        .map(|(index, caps)| CodeBlock {
            index,
            code: caps.get(1).map_or("", |m| m.as_str()).to_owned(),
        })
        .collect()
}

/// `reply` with every `repl` block replaced by a blank line, so that code is never read as
/// prose (a `FINAL(...)` inside a block is code, not a final-answer line).
pub(crate) fn prose_outside_blocks(reply: &str) -> String {
    REPL_BLOCK.replace_all(reply, "\n").into_owned()
}

/// One block of a reply and what running it produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockRun {
    /// The block.
    pub block: CodeBlock,
    /// Its execution.
    pub result: ExecutionResult,
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
