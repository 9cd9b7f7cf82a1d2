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
    /// Run the blocks, show the output, and ask the model to confirm the line (default).
    #[default]
    #[serde(alias = "see-output")]
    SeeOutputFirst,
    /// Run the blocks, then accept the line.
    Accept,
}

impl CodeAndFinal {
    /// The name used on the command line and in `rlm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeAndFinal::SeeOutputFirst => "see-output",
            CodeAndFinal::Accept => "accept",
        }
    }
}

/// The error for an unknown [`CodeAndFinal`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown code-and-final policy `{0}`; use `see-output` or `accept`")]
pub struct UnknownCodeAndFinal(pub String);

impl FromStr for CodeAndFinal {
    type Err = UnknownCodeAndFinal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "see-output" | "see_output_first" => Ok(CodeAndFinal::SeeOutputFirst),
            "accept" => Ok(CodeAndFinal::Accept),
            _ => Err(UnknownCodeAndFinal(s.to_owned())),
        }
    }
}

/// What the text of a reply says about finishing (outside `repl` blocks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalLines {
    /// The name from the first line beginning with `FINAL_VAR(`, trimmed of spaces and quotes
    /// (empty when the parentheses hold no name).
    pub final_var: Option<String>,
    /// The first line beginning with `FINAL(`.
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
pub fn scan_final_lines(reply: &str) -> FinalLines {
    let prose = prose_outside_blocks(reply);
    let mut lines = FinalLines::default();
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
        } else if trimmed.starts_with("FINAL(") && lines.final_text.is_none() {
            lines.final_text = Some(final_argument(&prose[at + "FINAL(".len()..]));
        }
    }
    lines
}

/// Trims whitespace and quote characters from both ends of a `FINAL_VAR` argument.
fn clean_name(raw: &str) -> String {
    raw.trim_matches(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
        .to_owned()
}

/// The text up to the parenthesis that balances an already consumed `(`.
fn final_argument(after_paren: &str) -> FinalText {
    // Quote-aware first, so `FINAL("a (b")` works; prose with a stray `"` falls back to
    // counting every parenthesis.
    let end = balance(after_paren, true).or_else(|| balance(after_paren, false));
    match end {
        Some(end) => FinalText::Closed(after_paren[..end].trim().to_owned()),
        None => FinalText::Unclosed,
    }
}

/// Byte offset of the `)` closing depth 1, if any.
fn balance(text: &str, respect_quotes: bool) -> Option<usize> {
    let mut depth = 1usize;
    let mut in_string = false;
    let mut escaped = false;
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
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Decides whether a reply ended the run.
///
/// `code_finals` are the final answers the reply's blocks recorded, in block order
/// (`(kind, value)` with kind [`FinalKind::AnswerDict`] or [`FinalKind::FinalVar`]);
/// `had_blocks` says whether the reply contained any `repl` block; `resolve` reads a session
/// variable as `str(value)` (`None` when unset).
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
///    - then the first line that begins with `FINAL(`: its argument is the answer verbatim
///      (quotes kept, may span lines, nested parentheses kept, `FINAL(func(a, b))` gives
///      `func(a, b)`) apart from surrounding whitespace. The argument ends at the parenthesis
///      that balances the opening one (parentheses inside double-quoted strings do not count);
///      anything after it on that line is ignored. An argument that never closes or is empty is
///      not final and the model is told so.
///
///    `FINAL` anywhere but at the start of a line (`The answer is FINAL(42)`) is prose.
///
/// [`Protocol`] selects the conventions that count; using an inactive one earns a note.
///
/// **Code and a final line in one reply.** A model that writes code *and* a `FINAL(...)` or
/// `FINAL_VAR(...)` line in the same reply wrote the answer before seeing what the code printed:
/// the answer is a prediction. [`CodeAndFinal::SeeOutputFirst`] (the default) runs the code,
/// shows the output, and asks the model to repeat the final line if it still holds; this costs
/// one more root call when the prediction was right and prevents a confidently wrong answer when
/// a block raised, timed out or printed something unexpected, which is what a user who relies on
/// the answer wants. [`CodeAndFinal::Accept`] takes the line at once (the value of `FINAL_VAR` is
/// read after the blocks ran). In-code conventions are never deferred: the code itself decided,
/// at run time, that the answer was ready.
pub fn check_completion(
    reply: &str,
    had_blocks: bool,
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
        if had_blocks && rules.code_and_final == CodeAndFinal::SeeOutputFirst {
            out.notes
                .push(FinalNote::SeeOutputFirst { kind: found.kind });
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
            Err("Unknown code-and-final policy `later`; use `see-output` or `accept`".to_owned())
        );
        for policy in [CodeAndFinal::SeeOutputFirst, CodeAndFinal::Accept] {
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
            ("FINAL(42) because the logs say so", closed("42")),
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
        had_blocks: bool,
        code: &[(FinalKind, &str)],
        rules: CompletionRules,
    ) -> Completion {
        let code: Vec<(FinalKind, String)> =
            code.iter().map(|(k, v)| (*k, v.to_string())).collect();
        check_completion(reply, had_blocks, &code, rules, &mut resolve)
    }

    fn answer(value: &str, kind: FinalKind) -> Option<FoundAnswer> {
        Some(FoundAnswer {
            value: value.into(),
            kind,
        })
    }

    const AUTO: CompletionRules = CompletionRules {
        protocol: Protocol::Auto,
        code_and_final: CodeAndFinal::SeeOutputFirst,
    };

    /// Name, reply, had blocks, code finals, rules, expected outcome.
    type Case<'a> = (
        &'a str,
        &'a str,
        bool,
        Vec<(FinalKind, &'a str)>,
        CompletionRules,
        Completion,
    );

    #[test]
    fn decision_table() {
        use FinalKind::*;
        let accept = CompletionRules {
            code_and_final: CodeAndFinal::Accept,
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
                false,
                vec![],
                AUTO,
                Completion::default(),
            ),
            (
                "final line",
                "FINAL(42)",
                false,
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
                false,
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
                false,
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
                false,
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
                false,
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
                false,
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
                false,
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
                false,
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
                false,
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
                true,
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
                true,
                vec![(FinalVar, "first"), (AnswerDict, "second")],
                accept,
                Completion {
                    answer: answer("first", FinalVar),
                    ..Default::default()
                },
            ),
            (
                "code and FINAL line: output first (default)",
                "```repl\nprint(1)\n```\nFINAL(1)",
                true,
                vec![],
                AUTO,
                Completion {
                    candidate: answer("1", FinalLine),
                    notes: vec![FinalNote::SeeOutputFirst { kind: FinalLine }],
                    ..Default::default()
                },
            ),
            (
                "code and FINAL_VAR line: output first, value read after the blocks",
                "```repl\nresult = 42\n```\nFINAL_VAR(result)",
                true,
                vec![],
                AUTO,
                Completion {
                    candidate: answer("42", FinalVarLine),
                    notes: vec![FinalNote::SeeOutputFirst { kind: FinalVarLine }],
                    ..Default::default()
                },
            ),
            (
                "code and FINAL line: accept",
                "```repl\nprint(1)\n```\nFINAL(1)",
                true,
                vec![],
                accept,
                Completion {
                    answer: answer("1", FinalLine),
                    ..Default::default()
                },
            ),
            (
                "FINAL inside the repl block is code",
                "```repl\nFINAL(1)\n```",
                true,
                vec![],
                AUTO,
                Completion::default(),
            ),
            (
                "protocol final ignores the answer dict",
                "```repl\nanswer['ready'] = True\n```",
                true,
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
                true,
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
                false,
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
                true,
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
                true,
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
                false,
                vec![],
                AUTO,
                Completion {
                    answer: answer("\"a\" (b)\n  c", FinalLine),
                    ..Default::default()
                },
            ),
        ];
        for (name, reply, had_blocks, code, rules, want) in cases {
            assert_eq!(check(reply, had_blocks, &code, rules), want, "case: {name}");
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
