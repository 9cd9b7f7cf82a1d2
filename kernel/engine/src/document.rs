//! Parsing documents that may be hostile — workflow files, a bundle's `config.yaml` and
//! `workflow.yaml`, `rlm.toml` — within a size limit and a nesting limit, both checked in
//! one linear pass before the parser sees the text.
//!
//! Why before, not after: under `yaml_serde`, libyaml's scanner keeps one "simple key" slot
//! per open flow collection (`[` or `{`) and looks at every slot for every token, so a file
//! of nested brackets costs the square of its depth: 100 KB of `[` takes 10 s or more to be
//! refused, although the deserializer stops at depth 128 — after the scanner has seen
//! everything. Counting how deep brackets nest (a running count of `[`/`{` less `]`/`}`) is
//! linear and stops such a file at once. The count ignores quotes and comments, so a
//! bracket inside a string counts too: it can only over-count, never let a deep file
//! through, and [`MAX_NESTING`] is far above what a real file nests. Block nesting (by
//! indentation) costs the scanner nothing extra and is bounded by the deserializer's own
//! limit, reported here in the same words. XML is parsed as a stream (`bundle::xml`), which
//! checks the depth of open elements against the same [`MAX_NESTING`] as it goes.
//!
//! Every parse of such a document goes through [`from_yaml`] or [`from_toml`] (files read
//! with [`read_to_string`], which stops past the size limit), so the limits hold everywhere
//! and are worded once. A [`ParseError`] carries the line and column and a message without
//! them; each caller names the file its own way.
//!
//! ```
//! use engine::document::{self, MAX_NESTING};
//!
//! let hostile = format!("a: {}", "[".repeat(100_000));
//! let err = document::from_yaml::<serde_json::Value>(&hostile).unwrap_err();
//! assert!(err.limit);
//! assert_eq!((err.line, err.column), (1, 4 + MAX_NESTING));
//! assert!(err.message.starts_with("Brackets nest more than 64 levels deep"));
//! ```

use std::io::Read as _;
use std::path::Path;

use serde::de::DeserializeOwned;

/// The largest document parsed: 2 MiB.
pub const MAX_BYTES: usize = 2 * 1024 * 1024;

/// How deep brackets (YAML flow collections, TOML inline arrays and tables) or XML elements
/// may nest.
pub const MAX_NESTING: usize = 64;

/// How deep `yaml_serde` lets any YAML collection nest (its own limit, not configurable).
const YAML_DESERIALIZER_DEPTH: usize = 128;

/// A document that could not be parsed, or that is over a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    /// The line of the problem (from 1; 1 when the parser gives none).
    pub line: usize,
    /// The column of the problem (from 1; 1 when the parser gives none).
    pub column: usize,
    /// What is wrong, without the position.
    pub message: String,
    /// Whether a limit refused the document (rather than its syntax or shape).
    pub limit: bool,
}

/// Parses YAML `text` as a `T`, within [`MAX_BYTES`] and [`MAX_NESTING`].
pub fn from_yaml<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    check(text, "YAML")?;
    yaml_serde::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((1, 1), |at| (at.line(), at.column()));
        let message = e.to_string();
        // The parser appends the position, which the caller shows in front.
        let suffix = format!(" at line {line} column {column}");
        let message = message.strip_suffix(&suffix).unwrap_or(&message);
        let limit = message.starts_with("recursion limit exceeded");
        let message = if limit {
            format!(
                "The YAML nests more than {YAML_DESERIALIZER_DEPTH} levels deep here; a YAML \
                 file may nest at most {YAML_DESERIALIZER_DEPTH} levels"
            )
        } else {
            message.to_owned()
        };
        ParseError {
            line,
            column,
            message,
            limit,
        }
    })
}

/// Parses TOML `text` as a `T`, within [`MAX_BYTES`] and [`MAX_NESTING`].
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    check(text, "TOML")?;
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |span| position(text, span.start));
        ParseError {
            line,
            column,
            message: e.message().trim_end().to_owned(),
            limit: false,
        }
    })
}

/// The text of the file at `path`, read only up to just past [`MAX_BYTES`] (so that a huge
/// file is refused by the size limit, not read whole).
pub fn read_to_string(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is not UTF-8 text",
        )
    })
}

/// Refuses `text` over [`MAX_BYTES`] or with brackets nested deeper than [`MAX_NESTING`];
/// `syntax` names the format in the message.
pub fn check(text: &str, syntax: &str) -> Result<(), ParseError> {
    if text.len() > MAX_BYTES {
        return Err(ParseError {
            line: 1,
            column: 1,
            message: format!(
                "The file is over the limit of {MAX_BYTES} bytes for a {syntax} file ({} bytes \
                 read)",
                text.len()
            ),
            limit: true,
        });
    }
    let mut depth = 0usize;
    for (at, byte) in text.bytes().enumerate() {
        match byte {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    let (line, column) = position(text, at);
                    return Err(ParseError {
                        line,
                        column,
                        message: format!(
                            "Brackets nest more than {MAX_NESTING} levels deep here (`[` and \
                             `{{` inside each other); a {syntax} file may nest at most \
                             {MAX_NESTING} levels"
                        ),
                        limit: true,
                    });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The line and column (from 1, the column in characters) of byte `at` of `text`.
fn position(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        1 + before.matches('\n').count(),
        1 + before[line_start..].chars().count(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn deep_brackets_are_refused_before_the_parser_sees_them() {
        // 100 KB of brackets: seconds of scanning without the check, nothing with it.
        for text in [
            format!("a: {}{}", "[".repeat(50_000), "]".repeat(50_000)),
            format!("a: {}", "{a: ".repeat(25_000)),
            "- ".repeat(10) + &"[".repeat(100_000),
        ] {
            let err = from_yaml::<Value>(&text).expect_err("refused");
            assert!(err.limit, "{err:?}");
            assert!(
                err.message
                    .starts_with("Brackets nest more than 64 levels deep here"),
                "{err}"
            );
            assert!(err.message.ends_with("at most 64 levels"), "{err}");
        }
        let err = from_toml::<Value>(&format!("a = {}", "[".repeat(100_000))).expect_err("no");
        assert!(
            err.limit && err.message.contains("a TOML file may nest"),
            "{err}"
        );
        assert_eq!((err.line, err.column), (1, 5 + MAX_NESTING));
    }

    #[test]
    fn nesting_up_to_the_limit_and_balanced_brackets_in_text_parse() {
        let deep = format!("a: {}1{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert!(from_yaml::<Value>(&deep).is_ok());
        // Many brackets, each closed: depth 1.
        let prose = format!("a: \"{}\"\n", "[x] {y} ".repeat(10_000));
        assert!(from_yaml::<Value>(&prose).is_ok());
    }

    #[test]
    fn deep_block_nesting_is_refused_by_the_parser_in_the_same_words() {
        let mut text = String::new();
        for level in 0..200 {
            text.push_str(&" ".repeat(level));
            text.push_str("a:\n");
        }
        let err = from_yaml::<Value>(&text).expect_err("refused");
        assert!(err.limit, "{err:?}");
        assert_eq!(
            err.message,
            "The YAML nests more than 128 levels deep here; a YAML file may nest at most 128 levels"
        );
    }

    #[test]
    fn an_oversized_document_is_refused_by_size() {
        let text = format!("a: \"{}\"\n", "x".repeat(MAX_BYTES));
        let err = from_yaml::<Value>(&text).expect_err("refused");
        assert!(err.limit);
        assert!(
            err.message
                .starts_with("The file is over the limit of 2097152 bytes for a YAML file"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_keep_their_position_and_drop_it_from_the_message() {
        let err = from_yaml::<Value>("a: 1\nb: [unclosed\nc: 3\n").expect_err("bad");
        assert!(!err.limit);
        assert!(err.line >= 2, "{err:?}");
        assert!(
            !err.message
                .ends_with(&format!("at line {} column {}", err.line, err.column)),
            "{err:?}"
        );
        let err = from_toml::<Value>("a = 1\nb = = 2\n").expect_err("bad");
        assert_eq!(err.line, 2, "{err:?}");
        assert!(!err.limit);
    }
}
