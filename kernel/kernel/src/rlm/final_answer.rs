//! Final-answer detection: the three conventions models use to say "done", and which of them
//! count in a run. The rules are documented on [`check_completion`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::blocks::prose_outside_blocks;

/// Which final-answer conventions end a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// All conventions: the `answer` dict, in-code `FINAL_VAR`, and `FINAL_VAR`/`FINAL` lines.
    #[default]
    Auto,
    /// `FINAL_VAR` (in code or as a line) and `FINAL(...)` lines.
    Final,
    /// Only the `answer` dict.
    Answer,
}

impl Protocol {
    /// Whether a final answer of `kind` ends the run under this protocol.
    pub fn accepts(self, kind: FinalKind) -> bool {
        match (self, kind) {
            (_, FinalKind::AnswerNow | FinalKind::Hook) => true,
            (Protocol::Auto, _) => true,
            (Protocol::Final, kind) => kind != FinalKind::AnswerDict,
            (Protocol::Answer, kind) => kind == FinalKind::AnswerDict,
        }
    }

    /// The stable name used on the command line and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Auto => "auto",
            Protocol::Final => "final",
            Protocol::Answer => "answer",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for an unknown protocol name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown protocol `{0}`; use `auto`, `final` or `answer`")]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Protocol::Auto),
            "final" => Ok(Protocol::Final),
            "answer" => Ok(Protocol::Answer),
            _ => Err(UnknownProtocol(s.to_owned())),
        }
    }
}

/// How a final answer was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalKind {
    /// `answer["ready"]` became truthy in a block.
    AnswerDict,
    /// `FINAL_VAR(x)` called in a block.
    FinalVar,
    /// A `FINAL_VAR(name)` line in the reply text.
    FinalVarLine,
    /// A `FINAL(...)` line in the reply text.
    FinalLine,
    /// The reply to the last "answer now" request after the iteration limit.
    AnswerNow,
    /// Supplied by a hook.
    Hook,
}

/// What to do with a reply that has both ```` ```repl ```` blocks and a `FINAL`/`FINAL_VAR` line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeAndFinal {
    /// Run the blocks, then accept the line, unless a block raised (default).
    #[default]
    #[serde(alias = "accept-unless-error")]
    AcceptUnlessError,
    /// Run the blocks, show the output, and ask the model to confirm the line.
    #[serde(alias = "see-output-first", alias = "see-output")]
    SeeOutputFirst,
    /// Run the blocks, then accept the line even when a block raised.
    Accept,
}

impl CodeAndFinal {
    /// The name used on the command line and in `rlm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeAndFinal::AcceptUnlessError => "accept-unless-error",
            CodeAndFinal::SeeOutputFirst => "see-output-first",
            CodeAndFinal::Accept => "accept",
        }
    }
}

/// The error for an unknown [`CodeAndFinal`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Unknown code-and-final policy `{0}`; use `accept-unless-error`, `see-output-first` or `accept`"
)]
pub struct UnknownCodeAndFinal(pub String);

impl FromStr for CodeAndFinal {
    type Err = UnknownCodeAndFinal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "accept-unless-error" | "accept_unless_error" => Ok(CodeAndFinal::AcceptUnlessError),
            "see-output-first" | "see-output" | "see_output_first" => {
                Ok(CodeAndFinal::SeeOutputFirst)
            }
            "accept" => Ok(CodeAndFinal::Accept),
            _ => Err(UnknownCodeAndFinal(s.to_owned())),
        }
    }
}

/// What became of a reply's ```` ```repl ```` blocks, for the completion check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyCode {
    /// The reply had no `repl` block.
    NoBlocks,
    /// Every block ran and none raised.
    Succeeded,
    /// A block raised or timed out, or not every block ran.
    Failed,
}

/// What the text of a reply says about finishing (outside `repl` blocks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalLines {
    /// The name from the first line beginning with `FINAL_VAR(`, trimmed of spaces and quotes
    /// (empty when the parentheses hold no name).
    pub final_var: Option<String>,
    /// The first final-answer line beginning with `FINAL(` (see [`check_completion`]).
    pub final_text: Option<FinalText>,
}

/// The argument of a `FINAL(` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalText {
    /// The argument up to the balancing parenthesis, trimmed of surrounding whitespace.
    Closed(String),
    /// The parentheses never balance.
    Unclosed,
}

/// Why a reply did not end the run although it tried to (and other notes on the reply); each
/// becomes a note to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "note", rename_all = "snake_case")]
pub enum FinalNote {
    /// `FINAL_VAR()` without a name.
    MissingName,
    /// `FINAL_VAR(name)` names no variable of the session.
    MissingVariable {
        /// The name as given.
        name: String,
    },
    /// The answer given is empty.
    EmptyValue {
        /// The convention used.
        kind: FinalKind,
        /// The variable, for `FINAL_VAR`.
        name: Option<String>,
    },
    /// `FINAL(` whose parentheses never balance.
    Unclosed,
    /// A convention this run's protocol does not count.
    Inactive {
        /// The convention used.
        kind: FinalKind,
        /// The run's protocol.
        protocol: Protocol,
    },
    /// A final line next to code: the model must see the output first.
    SeeOutputFirst {
        /// The convention used.
        kind: FinalKind,
    },
    /// A final line next to code of which a block raised: the answer is held back.
    HeldBackByError {
        /// The convention used.
        kind: FinalKind,
    },
    /// The reply stopped at the output token limit (added by the loop, not by the checker).
    CutOff,
}

/// A final answer and how it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundAnswer {
    /// The answer text.
    pub value: String,
    /// The convention that gave it.
    pub kind: FinalKind,
}

/// The completion check of one reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The final answer, if the reply ended the run.
    pub answer: Option<FoundAnswer>,
    /// An answer the model gave but that was not accepted (deferred until it sees the output);
    /// the best partial answer if the run stops before a real one.
    pub candidate: Option<FoundAnswer>,
    /// What to tell the model in the next message.
    pub notes: Vec<FinalNote>,
}

/// The settings of the completion check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRules {
    /// Which conventions count.
    pub protocol: Protocol,
    /// A reply with code and a final line.
    pub code_and_final: CodeAndFinal,
}

/// Finds the `FINAL_VAR(` and `FINAL(` lines of a reply, ignoring `repl` blocks.
///
/// Runs in time linear in the length of the reply, whatever it holds.
pub fn scan_final_lines(reply: &str) -> FinalLines {
    scan_counting(reply, &mut 0)
}

/// [`scan_final_lines`], adding to `work` the characters its parenthesis matching examined.
///
/// Each `FINAL(` line is matched from its `(` to the balancing `)`; a rejected line (text after
/// its `)`) makes the scan resume after that `)`, so no character is matched twice by the same
/// kind of scan, and a quote-aware match that ran off the end of the reply is not tried again.
/// Hence `work` grows by at most three times the length of the reply.
pub(crate) fn scan_counting(reply: &str, work: &mut usize) -> FinalLines {
    let prose = prose_outside_blocks(reply);
    let mut lines = FinalLines::default();
    let mut quotes_balance = true;
    // `FINAL(` lines that start before this offset are inside a rejected line's parentheses.
    let mut resume = 0;
    let mut offset = 0;
    for line in prose.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        let at = start + (line.len() - trimmed.len());
        if let Some(rest) = trimmed.strip_prefix("FINAL_VAR(") {
            if lines.final_var.is_none() {
                let inner = rest.split_once(')').map_or(rest, |(inner, _)| inner);
                lines.final_var = Some(clean_name(inner));
            }
        } else if trimmed.starts_with("FINAL(") && lines.final_text.is_none() && at >= resume {
            let arg_start = at + "FINAL(".len();
            match final_argument(&prose[arg_start..], &mut quotes_balance, work) {
                Argument::Final(text) => lines.final_text = Some(text),
                Argument::TextAfter { close } => resume = arg_start + close + 1,
            }
        }
    }
    lines
}

/// Trims whitespace and quote characters from both ends of a `FINAL_VAR` argument.
fn clean_name(raw: &str) -> String {
    raw.trim_matches(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
        .to_owned()
}

/// What follows a line's `FINAL(`.
enum Argument {
    /// A final-answer line: closed (and nothing but whitespace after it on its line), or
    /// never closed.
    Final(FinalText),
    /// The parentheses close at byte `close` but text follows on that line: not a final line.
    TextAfter { close: usize },
}

/// The text up to the parenthesis that balances an already consumed `(`, if only whitespace
/// follows it on its line.
fn final_argument(after_paren: &str, quotes_balance: &mut bool, work: &mut usize) -> Argument {
    // Quote-aware first, so `FINAL("a (b")` works; prose with a stray `"` falls back to
    // counting every parenthesis, and so does every later line once a stray quote was seen.
    let mut end = None;
    if *quotes_balance {
        end = balance(after_paren, true, work);
        *quotes_balance = end.is_some();
    }
    let Some(end) = end.or_else(|| balance(after_paren, false, work)) else {
        return Argument::Final(FinalText::Unclosed);
    };
    let tail = &after_paren[end + 1..];
    let rest_of_line = tail.split('\n').next().unwrap_or_default();
    *work += rest_of_line.len();
    if rest_of_line.trim().is_empty() {
        Argument::Final(FinalText::Closed(after_paren[..end].trim().to_owned()))
    } else {
        Argument::TextAfter { close: end }
    }
}

/// Byte offset of the `)` closing depth 1, if any; adds the bytes examined to `work`.
fn balance(text: &str, respect_quotes: bool, work: &mut usize) -> Option<usize> {
    let mut depth = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut end = None;
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' if respect_quotes => in_string = true,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    *work += end.map_or(text.len(), |i| i + 1);
    end
}

/// Decides whether a reply ended the run.
///
/// `code_finals` are the final answers the reply's blocks recorded, in block order
/// (`(kind, value)` with kind [`FinalKind::AnswerDict`] or [`FinalKind::FinalVar`]);
/// `code` says whether the reply had `repl` blocks and whether they all ran without raising;
/// `resolve` reads a session variable as `str(value)` (`None` when unset).
///
/// After all blocks of a reply ran, the reply is checked in this order:
///
/// 1. **In code**, block by block: the first block that recorded a final answer wins. The REPL
///    records one the moment `answer["ready"]` becomes truthy, as `str(answer["content"])` at
///    that moment (if the content is still empty then, the first non-empty content assigned
///    while `ready` is truthy) ([`FinalKind::AnswerDict`]); or when the code calls
///    `FINAL_VAR(x)` ([`FinalKind::FinalVar`]). Later blocks of the reply still run.
/// 2. **In the reply text** outside ```` ```repl ```` blocks (text inside them is code):
///    - the first line that begins, after whitespace, with `FINAL_VAR(name)`: the name is
///      trimmed of spaces and quotes and resolved in the session namespace (`str(value)`). A
///      missing name, an unknown variable or an empty value is not final; the model is told why
///      in the next message, and a `FINAL(...)` line of the same reply is still considered;
///    - then the first line that begins with `FINAL(` and ends with the parenthesis that
///      balances it: its argument is the answer verbatim (quotes kept, may span lines, nested
///      parentheses kept, `FINAL(func(a, b))` gives `func(a, b)`) apart from surrounding
///      whitespace. Parentheses inside double-quoted strings do not count. Only whitespace may
///      follow the balancing `)` on its line, as in the pattern `^\s*FINAL\((.*)\)\s*$`:
///      `FINAL(42) done` is prose, and so is every `FINAL(` line inside its parentheses. An
///      argument that never closes or is empty is not final and the model is told so.
///
///    `FINAL` anywhere but at the start of a line (`The answer is FINAL(42)`) is prose.
///
/// [`Protocol`] selects the conventions that count; using an inactive one earns a note.
///
/// **Code and a final line in one reply.** Models trained on the reference RLM runtime write
/// code *and* a `FINAL(...)` or `FINAL_VAR(...)` line in one reply and expect the run to end
/// there. [`CodeAndFinal::AcceptUnlessError`] (the default) runs the blocks first, then reads
/// the line, so `FINAL_VAR(x)` may name a variable the same reply's code assigned; but when a
/// block of that reply raised or timed out (or not every block ran), the answer was written
/// before a failure it could not foresee: it is held back ([`FinalNote::HeldBackByError`]), the
/// model sees the error and answers again, and the answer is kept as the best partial one.
/// [`CodeAndFinal::SeeOutputFirst`] holds back every such line until the model has seen the
/// output (one more root call); [`CodeAndFinal::Accept`] takes the line even after an error.
/// In-code conventions are never held back: the code itself decided, at run time, that the
/// answer was ready.
pub fn check_completion(
    reply: &str,
    code: ReplyCode,
    code_finals: &[(FinalKind, String)],
    rules: CompletionRules,
    resolve: &mut dyn FnMut(&str) -> Option<String>,
) -> Completion {
    let mut out = Completion::default();
    for (kind, value) in code_finals {
        if !rules.protocol.accepts(*kind) {
            push_once(
                &mut out.notes,
                FinalNote::Inactive {
                    kind: *kind,
                    protocol: rules.protocol,
                },
            );
            continue;
        }
        if value.trim().is_empty() {
            push_once(
                &mut out.notes,
                FinalNote::EmptyValue {
                    kind: *kind,
                    name: None,
                },
            );
            continue;
        }
        out.answer = Some(FoundAnswer {
            value: value.clone(),
            kind: *kind,
        });
        return out;
    }

    let lines = scan_final_lines(reply);
    let mut found = None;
    if let Some(name) = &lines.final_var {
        if !rules.protocol.accepts(FinalKind::FinalVarLine) {
            push_once(
                &mut out.notes,
                FinalNote::Inactive {
                    kind: FinalKind::FinalVarLine,
                    protocol: rules.protocol,
                },
            );
        } else if name.is_empty() {
            out.notes.push(FinalNote::MissingName);
        } else {
            match resolve(name) {
                None => out
                    .notes
                    .push(FinalNote::MissingVariable { name: name.clone() }),
                Some(value) if value.trim().is_empty() => out.notes.push(FinalNote::EmptyValue {
                    kind: FinalKind::FinalVarLine,
                    name: Some(name.clone()),
                }),
                Some(value) => {
                    found = Some(FoundAnswer {
                        value,
                        kind: FinalKind::FinalVarLine,
                    })
                }
            }
        }
    }
    if found.is_none()
        && let Some(text) = &lines.final_text
    {
        if !rules.protocol.accepts(FinalKind::FinalLine) {
            push_once(
                &mut out.notes,
                FinalNote::Inactive {
                    kind: FinalKind::FinalLine,
                    protocol: rules.protocol,
                },
            );
        } else {
            match text {
                FinalText::Unclosed => out.notes.push(FinalNote::Unclosed),
                FinalText::Closed(value) if value.is_empty() => {
                    out.notes.push(FinalNote::EmptyValue {
                        kind: FinalKind::FinalLine,
                        name: None,
                    });
                }
                FinalText::Closed(value) => {
                    found = Some(FoundAnswer {
                        value: value.clone(),
                        kind: FinalKind::FinalLine,
                    });
                }
            }
        }
    }
    if let Some(found) = found {
        let held_back = match (code, rules.code_and_final) {
            (ReplyCode::NoBlocks, _) | (_, CodeAndFinal::Accept) => None,
            (_, CodeAndFinal::SeeOutputFirst) => {
                Some(FinalNote::SeeOutputFirst { kind: found.kind })
            }
            (ReplyCode::Failed, CodeAndFinal::AcceptUnlessError) => {
                Some(FinalNote::HeldBackByError { kind: found.kind })
            }
            (ReplyCode::Succeeded, CodeAndFinal::AcceptUnlessError) => None,
        };
        if let Some(note) = held_back {
            out.notes.push(note);
            out.candidate = Some(found);
        } else {
            // A line that was accepted makes earlier complaints about the same reply moot.
            out.notes.clear();
            out.answer = Some(found);
        }
    }
    out
}

fn push_once(notes: &mut Vec<FinalNote>, note: FinalNote) {
    if !notes.contains(&note) {
        notes.push(note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::SubCallErrorMode;

    #[test]
    fn settings_parse_from_their_command_line_and_file_names() {
        for (text, want) in [
            ("see-output", CodeAndFinal::SeeOutputFirst),
            ("see_output_first", CodeAndFinal::SeeOutputFirst),
            ("see-output-first", CodeAndFinal::SeeOutputFirst),
            ("accept-unless-error", CodeAndFinal::AcceptUnlessError),
            ("accept_unless_error", CodeAndFinal::AcceptUnlessError),
            ("accept", CodeAndFinal::Accept),
        ] {
            assert_eq!(text.parse::<CodeAndFinal>(), Ok(want), "{text}");
            let json = serde_json::Value::String(text.to_owned());
            assert_eq!(
                serde_json::from_value::<CodeAndFinal>(json).ok(),
                Some(want)
            );
        }
        assert_eq!(
            "later".parse::<CodeAndFinal>().map_err(|e| e.to_string()),
            Err(
                "Unknown code-and-final policy `later`; use `accept-unless-error`, \
                 `see-output-first` or `accept`"
                    .to_owned()
            )
        );
        for policy in [
            CodeAndFinal::AcceptUnlessError,
            CodeAndFinal::SeeOutputFirst,
            CodeAndFinal::Accept,
        ] {
            assert_eq!(policy.as_str().parse::<CodeAndFinal>(), Ok(policy));
        }
        for mode in [SubCallErrorMode::ReturnString, SubCallErrorMode::Raise] {
            assert_eq!(mode.as_str().parse::<SubCallErrorMode>(), Ok(mode));
            let json = serde_json::Value::String(mode.as_str().to_owned());
            assert_eq!(
                serde_json::from_value::<SubCallErrorMode>(json).ok(),
                Some(mode)
            );
        }
        assert!("return_string".parse::<SubCallErrorMode>().is_ok());
        assert!("loud".parse::<SubCallErrorMode>().is_err());
    }

    fn text(reply: &str) -> Option<FinalText> {
        scan_final_lines(reply).final_text
    }

    fn closed(s: &str) -> Option<FinalText> {
        Some(FinalText::Closed(s.to_owned()))
    }

    #[test]
    fn final_line_table() {
        let cases: &[(&str, Option<FinalText>)] = &[
            ("FINAL(42)", closed("42")),
            ("  FINAL(42)", closed("42")),
            ("\tFINAL(42)  ", closed("42")),
            ("Done.\nFINAL(42)", closed("42")),
            ("The answer is FINAL(42)", None),
            ("**FINAL(42)**", None),
            ("FINAL(func(a, b))", closed("func(a, b)")),
            ("FINAL(\"Paris\")", closed("\"Paris\"")),
            ("FINAL('Paris')", closed("'Paris'")),
            ("FINAL(\"a (b\")", closed("\"a (b\"")),
            (
                "FINAL(5'11\" tall (approx))",
                closed("5'11\" tall (approx)"),
            ),
            (
                "FINAL(line one\nline two\n  line three)",
                closed("line one\nline two\n  line three"),
            ),
            ("FINAL( spaced )", closed("spaced")),
            // Only whitespace may follow the closing parenthesis on its line.
            ("FINAL(42) because the logs say so", None),
            ("FINAL(42) done\nFINAL(43)", closed("43")),
            ("FINAL(42).", None),
            ("FINAL(42)\r\n", closed("42")),
            ("FINAL(a) (b)", None),
            ("FINAL(f(x)) \t ", closed("f(x)")),
            ("FINAL(multi\nline) trailing\nFINAL(next)", closed("next")),
            // A FINAL line inside a rejected line's parentheses is part of that text.
            ("FINAL(outer\nFINAL(inner)\n) trailing", None),
            ("FINAL(\"a)\" b) c", None),
            ("FINAL(\"a)\" b)", closed("\"a)\" b")),
            ("FINAL(42)\nNote: an estimate (roughly)", closed("42")),
            ("FINAL()", closed("")),
            ("FINAL(3 (approx", Some(FinalText::Unclosed)),
            ("FINAL_ANSWER(42)", None),
            ("final(42)", None),
            ("FINAL (42)", None),
            // Text inside repl blocks is code.
            ("```repl\nFINAL(42)\n```", None),
            ("```repl\nx = 1\n```\nFINAL(x is 1)", closed("x is 1")),
            // Other fences are prose.
            ("```text\nFINAL(7)\n```", closed("7")),
            // The first FINAL line wins.
            ("FINAL(1)\nFINAL(2)", closed("1")),
        ];
        for (reply, want) in cases {
            assert_eq!(&text(reply), want, "reply: {reply:?}");
        }
    }

    #[test]
    fn final_var_line_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("FINAL_VAR(result)", Some("result")),
            ("  FINAL_VAR( result )", Some("result")),
            ("FINAL_VAR(\"result\")", Some("result")),
            ("FINAL_VAR('result')", Some("result")),
            ("FINAL_VAR(`result`)", Some("result")),
            ("FINAL_VAR()", Some("")),
            ("FINAL_VAR(result", Some("result")),
            ("I will call FINAL_VAR(result)", None),
            ("```repl\nFINAL_VAR(result)\n```", None),
            ("FINAL_VAR(a)\nFINAL_VAR(b)", Some("a")),
        ];
        for (reply, want) in cases {
            assert_eq!(
                scan_final_lines(reply).final_var.as_deref(),
                *want,
                "reply: {reply:?}"
            );
        }
    }

    /// The namespace used by the decision tests: `result = "42"`, `blank = ""`.
    fn resolve(name: &str) -> Option<String> {
        match name {
            "result" => Some("42".into()),
            "blank" => Some("   ".into()),
            _ => None,
        }
    }

    fn check(
        reply: &str,
        reply_code: ReplyCode,
        code: &[(FinalKind, &str)],
        rules: CompletionRules,
    ) -> Completion {
        let code: Vec<(FinalKind, String)> =
            code.iter().map(|(k, v)| (*k, v.to_string())).collect();
        check_completion(reply, reply_code, &code, rules, &mut resolve)
    }

    fn answer(value: &str, kind: FinalKind) -> Option<FoundAnswer> {
        Some(FoundAnswer {
            value: value.into(),
            kind,
        })
    }

    const AUTO: CompletionRules = CompletionRules {
        protocol: Protocol::Auto,
        code_and_final: CodeAndFinal::AcceptUnlessError,
    };

    #[test]
    fn defaults_are_auto_and_accept_unless_error() {
        assert_eq!(CompletionRules::default(), AUTO);
    }

    /// Name, reply, what became of its code, code finals, rules, expected outcome.
    type Case<'a> = (
        &'a str,
        &'a str,
        ReplyCode,
        Vec<(FinalKind, &'a str)>,
        CompletionRules,
        Completion,
    );

    #[test]
    fn decision_table() {
        use FinalKind::*;
        use ReplyCode::*;
        let accept = CompletionRules {
            code_and_final: CodeAndFinal::Accept,
            ..AUTO
        };
        let see_output = CompletionRules {
            code_and_final: CodeAndFinal::SeeOutputFirst,
            ..AUTO
        };
        let final_only = CompletionRules {
            protocol: Protocol::Final,
            ..AUTO
        };
        let answer_only = CompletionRules {
            protocol: Protocol::Answer,
            ..AUTO
        };
        let cases: Vec<Case<'_>> = vec![
            (
                "nothing",
                "thinking...",
                NoBlocks,
                vec![],
                AUTO,
                Completion::default(),
            ),
            (
                "final line",
                "FINAL(42)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    answer: answer("42", FinalLine),
                    ..Default::default()
                },
            ),
            (
                "final_var line resolves",
                "FINAL_VAR(result)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    answer: answer("42", FinalVarLine),
                    ..Default::default()
                },
            ),
            (
                "final_var line checked before final line",
                "FINAL(7)\nFINAL_VAR(result)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    answer: answer("42", FinalVarLine),
                    ..Default::default()
                },
            ),
            (
                "missing variable is not final and says so",
                "FINAL_VAR(nope)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    notes: vec![FinalNote::MissingVariable {
                        name: "nope".into(),
                    }],
                    ..Default::default()
                },
            ),
            (
                "missing variable, then a FINAL line in the same reply",
                "FINAL_VAR(nope)\nFINAL(7)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    answer: answer("7", FinalLine),
                    ..Default::default()
                },
            ),
            (
                "empty variable is not final",
                "FINAL_VAR(blank)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    notes: vec![FinalNote::EmptyValue {
                        kind: FinalVarLine,
                        name: Some("blank".into()),
                    }],
                    ..Default::default()
                },
            ),
            (
                "no name",
                "FINAL_VAR()",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    notes: vec![FinalNote::MissingName],
                    ..Default::default()
                },
            ),
            (
                "empty FINAL",
                "FINAL(  )",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    notes: vec![FinalNote::EmptyValue {
                        kind: FinalLine,
                        name: None,
                    }],
                    ..Default::default()
                },
            ),
            (
                "unclosed FINAL",
                "FINAL(3 (approx",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    notes: vec![FinalNote::Unclosed],
                    ..Default::default()
                },
            ),
            (
                "answer dict from code",
                "```repl\nanswer['ready'] = True\n```",
                Succeeded,
                vec![(AnswerDict, "done")],
                AUTO,
                Completion {
                    answer: answer("done", AnswerDict),
                    ..Default::default()
                },
            ),
            (
                "first code final wins over later ones and over lines",
                "```repl\na\n```\n```repl\nb\n```\nFINAL(9)",
                Succeeded,
                vec![(FinalVar, "first"), (AnswerDict, "second")],
                accept,
                Completion {
                    answer: answer("first", FinalVar),
                    ..Default::default()
                },
            ),
            (
                "code and FINAL line: accepted after the blocks ran (default)",
                "```repl\nprint(1)\n```\nFINAL(1)",
                Succeeded,
                vec![],
                AUTO,
                Completion {
                    answer: answer("1", FinalLine),
                    ..Default::default()
                },
            ),
            (
                "code and FINAL_VAR line: the value is read after the blocks (default)",
                "```repl\nresult = 42\n```\nFINAL_VAR(result)",
                Succeeded,
                vec![],
                AUTO,
                Completion {
                    answer: answer("42", FinalVarLine),
                    ..Default::default()
                },
            ),
            (
                "code that raised holds the FINAL line back (default)",
                "```repl\n1/0\n```\nFINAL(1)",
                Failed,
                vec![],
                AUTO,
                Completion {
                    candidate: answer("1", FinalLine),
                    notes: vec![FinalNote::HeldBackByError { kind: FinalLine }],
                    ..Default::default()
                },
            ),
            (
                "code that raised holds the FINAL_VAR line back (default)",
                "```repl\nresult = 42\n1/0\n```\nFINAL_VAR(result)",
                Failed,
                vec![],
                AUTO,
                Completion {
                    candidate: answer("42", FinalVarLine),
                    notes: vec![FinalNote::HeldBackByError { kind: FinalVarLine }],
                    ..Default::default()
                },
            ),
            (
                "code that raised does not hold back an in-code answer",
                "```repl\nFINAL_VAR(result)\n```\n```repl\n1/0\n```",
                Failed,
                vec![(FinalVar, "42")],
                AUTO,
                Completion {
                    answer: answer("42", FinalVar),
                    ..Default::default()
                },
            ),
            (
                "code and FINAL line: see output first",
                "```repl\nprint(1)\n```\nFINAL(1)",
                Succeeded,
                vec![],
                see_output,
                Completion {
                    candidate: answer("1", FinalLine),
                    notes: vec![FinalNote::SeeOutputFirst { kind: FinalLine }],
                    ..Default::default()
                },
            ),
            (
                "code and FINAL_VAR line: see output first, value read after the blocks",
                "```repl\nresult = 42\n```\nFINAL_VAR(result)",
                Succeeded,
                vec![],
                see_output,
                Completion {
                    candidate: answer("42", FinalVarLine),
                    notes: vec![FinalNote::SeeOutputFirst { kind: FinalVarLine }],
                    ..Default::default()
                },
            ),
            (
                "code that raised and a FINAL line: accept",
                "```repl\n1/0\n```\nFINAL(1)",
                Failed,
                vec![],
                accept,
                Completion {
                    answer: answer("1", FinalLine),
                    ..Default::default()
                },
            ),
            (
                "a FINAL line followed by text on its line is prose",
                "```repl\nprint(1)\n```\nFINAL(1) and more",
                Succeeded,
                vec![],
                AUTO,
                Completion::default(),
            ),
            (
                "FINAL inside the repl block is code",
                "```repl\nFINAL(1)\n```",
                Succeeded,
                vec![],
                AUTO,
                Completion::default(),
            ),
            (
                "protocol final ignores the answer dict",
                "```repl\nanswer['ready'] = True\n```",
                Succeeded,
                vec![(AnswerDict, "done")],
                final_only,
                Completion {
                    notes: vec![FinalNote::Inactive {
                        kind: AnswerDict,
                        protocol: Protocol::Final,
                    }],
                    ..Default::default()
                },
            ),
            (
                "protocol final accepts in-code FINAL_VAR",
                "```repl\nFINAL_VAR(result)\n```",
                Succeeded,
                vec![(FinalVar, "42")],
                final_only,
                Completion {
                    answer: answer("42", FinalVar),
                    ..Default::default()
                },
            ),
            (
                "protocol answer ignores lines",
                "FINAL(42)",
                NoBlocks,
                vec![],
                answer_only,
                Completion {
                    notes: vec![FinalNote::Inactive {
                        kind: FinalLine,
                        protocol: Protocol::Answer,
                    }],
                    ..Default::default()
                },
            ),
            (
                "protocol answer ignores in-code FINAL_VAR",
                "```repl\nFINAL_VAR(result)\n```",
                Succeeded,
                vec![(FinalVar, "42")],
                answer_only,
                Completion {
                    notes: vec![FinalNote::Inactive {
                        kind: FinalVar,
                        protocol: Protocol::Answer,
                    }],
                    ..Default::default()
                },
            ),
            (
                "empty answer content is not final",
                "```repl\nanswer['ready'] = True\n```",
                Succeeded,
                vec![(AnswerDict, "")],
                AUTO,
                Completion {
                    notes: vec![FinalNote::EmptyValue {
                        kind: AnswerDict,
                        name: None,
                    }],
                    ..Default::default()
                },
            ),
            (
                "multi-line verbatim answer keeps quotes and parentheses",
                "Here it is.\nFINAL(\"a\" (b)\n  c)",
                NoBlocks,
                vec![],
                AUTO,
                Completion {
                    answer: answer("\"a\" (b)\n  c", FinalLine),
                    ..Default::default()
                },
            ),
        ];
        for (name, reply, reply_code, code, rules, want) in cases {
            assert_eq!(check(reply, reply_code, &code, rules), want, "case: {name}");
        }
    }

    #[test]
    fn protocol_parses_and_prints() {
        for p in [Protocol::Auto, Protocol::Final, Protocol::Answer] {
            assert_eq!(p.to_string().parse::<Protocol>(), Ok(p));
        }
        assert_eq!(" FINAL ".parse::<Protocol>(), Ok(Protocol::Final));
        let err = "both".parse::<Protocol>().expect_err("unknown name");
        assert_eq!(
            err.to_string(),
            "Unknown protocol `both`; use `auto`, `final` or `answer`"
        );
    }
}
