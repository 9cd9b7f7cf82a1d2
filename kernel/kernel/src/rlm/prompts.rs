//! The texts a model receives: files in `prompts/` compiled into the binary, filled in with the
//! run's settings.
//!
//! Templates use `{{name}}` placeholders, filled in one pass (a value that itself contains
//! `{{...}}` is inserted as is). A system-prompt override may use the same placeholders; unknown
//! ones are left untouched.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::final_answer::{CodeAndFinal, CompletionRules, FinalKind, FinalNote, Protocol};
use crate::repl::{ContextKind, ContextMetadata, SessionConfig, SubCallErrorMode};

const SYSTEM: &str = include_str!("../../../../prompts/system.md");
const FINISH_AUTO: &str = include_str!("../../../../prompts/finish_auto.md");
const FINISH_FINAL: &str = include_str!("../../../../prompts/finish_final.md");
const FINISH_ANSWER: &str = include_str!("../../../../prompts/finish_answer.md");
const CODE_AND_FINAL: &str = include_str!("../../../../prompts/code_and_final.md");
const CODE_AND_FINAL_UNLESS_ERROR: &str =
    include_str!("../../../../prompts/code_and_final_unless_error.md");
const FIRST_MESSAGE: &str = include_str!("../../../../prompts/first_message.md");
const FOLLOW_UP_MESSAGE: &str = include_str!("../../../../prompts/follow_up_message.md");
const FEEDBACK_FOOTER: &str = include_str!("../../../../prompts/feedback_footer.md");
const NO_CODE: &str = include_str!("../../../../prompts/no_code.md");
const ANSWER_NOW: &str = include_str!("../../../../prompts/answer_now.md");
const NOTE_MISSING_NAME: &str = include_str!("../../../../prompts/notes/missing_name.md");
const NOTE_MISSING_VARIABLE: &str = include_str!("../../../../prompts/notes/missing_variable.md");
const NOTE_EMPTY_VALUE: &str = include_str!("../../../../prompts/notes/empty_value.md");
const NOTE_UNCLOSED: &str = include_str!("../../../../prompts/notes/unclosed.md");
const NOTE_INACTIVE: &str = include_str!("../../../../prompts/notes/inactive.md");
const NOTE_SEE_OUTPUT_FIRST: &str = include_str!("../../../../prompts/notes/see_output_first.md");
const NOTE_HELD_BACK: &str = include_str!("../../../../prompts/notes/held_back.md");
const HOW_ANSWER: &str = include_str!("../../../../prompts/notes/how_answer.md");
const HOW_FINAL: &str = include_str!("../../../../prompts/notes/how_final.md");
const NOTE_CUT_OFF: &str = include_str!("../../../../prompts/notes/cut_off.md");
const SUB_CALL_ERRORS_STRING: &str = include_str!("../../../../prompts/sub_call_errors_string.md");
const SUB_CALL_ERRORS_RAISE: &str = include_str!("../../../../prompts/sub_call_errors_raise.md");
const SUB_MODELS_ONE: &str = include_str!("../../../../prompts/sub_models_one.md");
const SUB_MODELS_MANY: &str = include_str!("../../../../prompts/sub_models_many.md");
const RLM_QUERY: &str = include_str!("../../../../prompts/rlm_query.md");

/// Columns of a table context listed by name in the description.
const MAX_LISTED_COLUMNS: usize = 40;

/// User-supplied prompt text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PromptConfig {
    /// Replaces the built-in system prompt (e.g. from `--system-prompt FILE`).
    pub system_override: Option<String>,
    /// Appended to the system prompt (e.g. from `--prompt-extension FILE`): domain knowledge.
    pub extension: Option<String>,
    /// The prompt size sub-models handle well, in characters; the system prompt states it.
    pub sub_context_chars: usize,
}

impl Default for PromptConfig {
    fn default() -> Self {
        Self {
            system_override: None,
            extension: None,
            sub_context_chars: 200_000,
        }
    }
}

/// Every text of one run, ready to fill in; two equal ones fill in the same texts.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompts {
    config: PromptConfig,
    rules: CompletionRules,
    feedback_limit: usize,
    max_iterations: u32,
    cell_timeout: Duration,
    sub_call_errors: SubCallErrorMode,
    /// The endpoint `llm_query` uses by default.
    default_sub: String,
    /// Endpoints the code may name with `model=`, with their model names.
    sub_models: Vec<(String, String)>,
    /// Whether the code may start `rlm_query` children (the system prompt says so only then).
    children: bool,
}

impl Prompts {
    /// Prompts for a run with these settings.
    pub fn new(
        config: PromptConfig,
        rules: CompletionRules,
        feedback_limit: usize,
        max_iterations: u32,
    ) -> Self {
        let session = SessionConfig::default();
        Self {
            config,
            rules,
            feedback_limit,
            max_iterations,
            cell_timeout: session.cell_timeout,
            sub_call_errors: session.sub_call_errors,
            default_sub: session.sub_endpoint,
            sub_models: Vec::new(),
            children: false,
        }
    }

    /// States the session's block time limit and sub-call error behaviour (defaults:
    /// [`SessionConfig::default`]).
    pub fn with_session(mut self, session: &SessionConfig) -> Self {
        self.cell_timeout = session.cell_timeout;
        self.sub_call_errors = session.sub_call_errors;
        self.default_sub = session.sub_endpoint.clone();
        self
    }

    /// Says whether the run's code may start `rlm_query` children: the system prompt
    /// describes `rlm_query` only when it may.
    pub fn with_children(mut self, children: bool) -> Self {
        self.children = children;
        self
    }

    /// Names the endpoints the code may pick with `model=` (name, model), so the system
    /// prompt can list them.
    pub fn with_sub_models(mut self, models: Vec<(String, String)>) -> Self {
        self.sub_models = models;
        self
    }

    /// The system prompt's line on `model=`.
    fn sub_models_line(&self) -> String {
        let default = &self.default_sub;
        let line = if self.sub_models.iter().all(|(name, _)| name == default) {
            SUB_MODELS_ONE.to_owned()
        } else {
            let models: Vec<String> = self
                .sub_models
                .iter()
                .map(|(name, model)| format!("`{name}` ({model})"))
                .collect();
            fill(
                SUB_MODELS_MANY,
                &[("models", &models.join(", ")), ("default", default)],
            )
        };
        if self.children {
            format!("{}\n{}", line.trim_end(), RLM_QUERY.trim_end())
        } else {
            line
        }
    }

    /// The system prompt: the built-in text or the override, then the extension.
    pub fn system_prompt(&self) -> String {
        let template = self.config.system_override.as_deref().unwrap_or(SYSTEM);
        let finish = self.finish_instructions();
        let feedback_limit = group_digits(self.feedback_limit as u64);
        let sub_chars = group_digits(self.config.sub_context_chars as u64);
        let sub_call_errors = match self.sub_call_errors {
            SubCallErrorMode::ReturnString => SUB_CALL_ERRORS_STRING,
            SubCallErrorMode::Raise => SUB_CALL_ERRORS_RAISE,
        };
        let mut text = fill(
            template,
            &[
                ("finish_instructions", finish.trim_end()),
                ("feedback_limit", &feedback_limit),
                ("sub_context_chars", &sub_chars),
                ("max_iterations", &self.max_iterations.to_string()),
                ("cell_timeout", &spoken_duration(self.cell_timeout)),
                ("sub_call_errors", sub_call_errors.trim_end()),
                ("sub_models", self.sub_models_line().trim_end()),
            ],
        );
        let text_end = text.trim_end().len();
        text.truncate(text_end);
        if let Some(extension) = self.config.extension.as_deref().map(str::trim)
            && !extension.is_empty()
        {
            text.push_str("\n\n");
            text.push_str(extension);
        }
        text.push('\n');
        text
    }

    /// How to finish under the active protocol and code-and-final policy.
    pub fn finish_instructions(&self) -> String {
        let template = match self.rules.protocol {
            Protocol::Auto => FINISH_AUTO,
            Protocol::Final => FINISH_FINAL,
            Protocol::Answer => FINISH_ANSWER,
        };
        let code_and_final = match self.rules.code_and_final {
            CodeAndFinal::AcceptUnlessError => CODE_AND_FINAL_UNLESS_ERROR,
            CodeAndFinal::SeeOutputFirst => CODE_AND_FINAL,
            CodeAndFinal::Accept => "",
        };
        let text = fill(template, &[("code_and_final", code_and_final.trim_end())]);
        format!("{}\n", text.trim_end())
    }

    /// The first user message: the context description and the query.
    pub fn first_message(&self, contexts: &[ContextMetadata], query: &str) -> String {
        let description = describe_contexts(contexts);
        fill(
            FIRST_MESSAGE,
            &[
                ("context_description", description.trim_end()),
                ("query", query.trim()),
                ("max_iterations", &self.max_iterations.to_string()),
            ],
        )
    }

    /// The first user message of a follow-up question: the context description, a summary of
    /// the earlier questions asked in the same session, and the query.
    pub fn follow_up_message(
        &self,
        contexts: &[ContextMetadata],
        earlier: &str,
        query: &str,
    ) -> String {
        let description = describe_contexts(contexts);
        fill(
            FOLLOW_UP_MESSAGE,
            &[
                ("context_description", description.trim_end()),
                ("earlier", earlier.trim()),
                ("query", query.trim()),
                ("max_iterations", &self.max_iterations.to_string()),
            ],
        )
    }

    /// The line closing each feedback message.
    pub fn feedback_footer(&self, iterations_done: u32) -> String {
        let left = self.max_iterations.saturating_sub(iterations_done);
        fill(
            FEEDBACK_FOOTER,
            &[
                ("iterations_left", &left.to_string()),
                ("max_iterations", &self.max_iterations.to_string()),
            ],
        )
    }

    /// The nudge for a reply without code that did not finish.
    pub fn no_code_nudge(&self) -> &'static str {
        NO_CODE
    }

    /// The request for an answer after the last iteration.
    pub fn answer_now(&self) -> &'static str {
        ANSWER_NOW
    }

    /// The sentence telling the model why its attempt to finish did not count.
    pub fn note(&self, note: &FinalNote) -> String {
        let text = match note {
            FinalNote::MissingName => NOTE_MISSING_NAME.to_owned(),
            FinalNote::MissingVariable { name } => fill(NOTE_MISSING_VARIABLE, &[("name", name)]),
            FinalNote::EmptyValue { kind, name } => {
                let convention = match (kind, name) {
                    (FinalKind::FinalVarLine, Some(name)) => format!("`FINAL_VAR({name})`"),
                    _ => format!("`{}`", convention(*kind)),
                };
                fill(NOTE_EMPTY_VALUE, &[("convention", &convention)])
            }
            FinalNote::Unclosed => NOTE_UNCLOSED.to_owned(),
            FinalNote::Inactive { kind, protocol } => {
                let how = match protocol {
                    Protocol::Answer => HOW_ANSWER,
                    Protocol::Auto | Protocol::Final => HOW_FINAL,
                };
                fill(
                    NOTE_INACTIVE,
                    &[
                        ("convention", &format!("`{}`", convention(*kind))),
                        ("protocol", protocol.as_str()),
                        ("how_to_finish", how.trim_end()),
                    ],
                )
            }
            FinalNote::CutOff => NOTE_CUT_OFF.to_owned(),
            FinalNote::SeeOutputFirst { kind } => fill(
                NOTE_SEE_OUTPUT_FIRST,
                &[("convention", &format!("a `{}` line", convention(*kind)))],
            ),
            FinalNote::HeldBackByError { kind } => fill(
                NOTE_HELD_BACK,
                &[("convention", &format!("a `{}` line", convention(*kind)))],
            ),
        };
        format!("{}\n", text.trim_end())
    }
}

/// A system prompt kept with the [`Prompts`] it was rendered from, for runs that may send the
/// same (a run's `rlm_query` children): a run whose prompts equal the kept ones gets the kept
/// text, another renders its own, which is kept instead. The key is everything the renderer
/// reads ([`Prompts::system_prompt`] takes nothing but its `Prompts`), so an input added
/// there is in the key too.
#[derive(Debug, Default)]
pub(crate) struct KeptSystemPrompt(Mutex<Option<(Prompts, String)>>);

impl KeptSystemPrompt {
    /// The system prompt of `prompts`: the kept one when it was rendered from equal prompts.
    pub(crate) fn system_prompt(&self, prompts: &Prompts) -> String {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((from, text)) = &*kept
            && from == prompts
        {
            return text.clone();
        }
        let text = prompts.system_prompt();
        *kept = Some((prompts.clone(), text.clone()));
        text
    }
}

/// How a model spells a convention, for notes.
fn convention(kind: FinalKind) -> &'static str {
    match kind {
        FinalKind::AnswerDict => "answer[\"ready\"]",
        FinalKind::FinalVar | FinalKind::FinalVarLine => "FINAL_VAR(...)",
        FinalKind::FinalLine => "FINAL(...)",
        FinalKind::AnswerNow => "the last reply",
        FinalKind::Hook => "a hook",
    }
}

/// A description of the loaded contexts for the first message, built from their metadata.
pub fn describe_contexts(contexts: &[ContextMetadata]) -> String {
    let mut out = String::from("# Context\n\n");
    match contexts.len() {
        0 => {
            out.push_str("No context was loaded; `context` is empty.\n");
            return out;
        }
        1 => out.push_str("The session holds one context:\n\n"),
        n => out.push_str(&format!("The session holds {n} contexts:\n\n")),
    }
    for meta in contexts {
        out.push_str(&describe_context(meta));
    }
    out
}

fn describe_context(meta: &ContextMetadata) -> String {
    let positional = format!("context_{}", meta.index);
    // The first context is `context` first: the system prompt speaks of `context`.
    let mut names = Vec::new();
    if meta.name != positional {
        names.push(meta.name.clone());
    }
    if meta.index == 0 {
        names.push("context".to_owned());
    }
    names.push(positional);
    let name = match names.split_first() {
        Some((first, [])) => format!("`{first}`"),
        Some((first, rest)) => format!(
            "`{first}` (also {})",
            rest.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    let size = match meta.compression {
        Some(c) => format!("{} {}-compressed", human_bytes(meta.bytes), c.label()),
        None => human_bytes(meta.bytes),
    };
    let frame = meta.python_type();
    let shape = match meta.kind {
        ContextKind::Text => format!(
            "text, a Python `str` of {} characters ({size})",
            meta.chars.map_or_else(|| "?".to_owned(), group_digits)
        ),
        ContextKind::Json => format!(
            "parsed JSON, a `dict` or `list` ({})",
            joined(&[
                count_phrase(meta.items, "top-level item"),
                Some(format!("{size} of JSON"))
            ])
        ),
        ContextKind::JsonLines => format!(
            "JSON Lines, a `list` of {} ({size})",
            count_phrase(meta.items, "record").unwrap_or_else(|| "records".to_owned())
        ),
        ContextKind::Table => {
            let columns = meta.columns.as_ref().map_or(0, Vec::len);
            format!(
                "a table, a `{frame}` of {} rows and {} columns ({size} {})",
                meta.rows.map_or_else(|| "?".to_owned(), group_digits),
                columns,
                if meta.is_live() {
                    "in memory"
                } else {
                    "on disk"
                }
            )
        }
        ContextKind::Workbook => format!(
            "an Excel workbook, a `{frame}` of {} by sheet name ({size} on disk)",
            count_phrase(meta.items, "sheet").unwrap_or_else(|| "sheets".to_owned())
        ),
        ContextKind::Directory => {
            let kinds: Vec<String> = meta
                .file_kinds
                .iter()
                .map(|(kind, n)| {
                    format!("{} `{}`", group_digits(*n), kind.python_type(meta.frames))
                })
                .collect();
            let files = count_phrase(meta.items, "file").map(|files| match kinds.is_empty() {
                true => files,
                false => format!("{files}: {}", kinds.join(", ")),
            });
            format!(
                "a directory, a `dict` mapping relative path to the file loaded by its kind ({})",
                joined(&[files, Some(size.clone())])
            )
        }
    };
    let mut line = format!("- {name}: {shape}, from `{}`.\n", meta.source);
    if meta.empty {
        line.push_str("  It is empty.\n");
    }
    if let Some(rows) = meta.skipped_rows {
        line.push_str(&format!(
            "  {} malformed row(s) were left out (the first at line {}).\n",
            group_digits(rows.count),
            group_digits(rows.first_line)
        ));
    }
    if !meta.skipped_files.is_empty() {
        line.push_str(&format!(
            "  {} file(s) that cannot be loaded (images, archives, other binaries) were left out.\n",
            group_digits(meta.skipped_files.len() as u64)
        ));
    }
    if let Some(sizes) = &meta.item_sizes {
        line.push_str(&format!(
            "  Item sizes: {} to {} characters, median {}.\n",
            group_digits(sizes.min),
            group_digits(sizes.max),
            group_digits(sizes.median)
        ));
    }
    if !meta.sheets.is_empty() {
        let sheets: Vec<String> = meta
            .sheets
            .iter()
            .take(MAX_LISTED_COLUMNS)
            .map(|s| {
                format!(
                    "`{}` ({} rows, {} columns)",
                    s.name,
                    group_digits(s.rows),
                    s.columns
                )
            })
            .collect();
        line.push_str(&format!("  Sheets: {}.\n", sheets.join(", ")));
    }
    if let Some(columns) = meta.columns.as_ref().filter(|c| !c.is_empty()) {
        let listed: Vec<String> = columns
            .iter()
            .take(MAX_LISTED_COLUMNS)
            .map(|(name, dtype)| format!("`{name}` ({dtype})"))
            .collect();
        line.push_str("  Columns: ");
        line.push_str(&listed.join(", "));
        if columns.len() > MAX_LISTED_COLUMNS {
            line.push_str(&format!(
                ", and {} more",
                group_digits((columns.len() - MAX_LISTED_COLUMNS) as u64)
            ));
        }
        line.push_str(".\n");
    }
    line
}

/// `3 files`, `1 file`.
fn count_phrase(count: Option<u64>, noun: &str) -> Option<String> {
    count.map(|n| match n {
        1 => format!("1 {noun}"),
        n => format!("{} {noun}s", group_digits(n)),
    })
}

fn joined(parts: &[Option<String>]) -> String {
    parts
        .iter()
        .flatten()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fills `{{name}}` placeholders in one pass; unknown placeholders stay as written.
pub(crate) fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let key = &after[..end];
        match values.iter().find(|(k, _)| *k == key) {
            Some((_, value)) => out.push_str(value),
            None => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `2 minutes`, `30 seconds`, `1.5 seconds`.
fn spoken_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 120.0 && secs % 60.0 == 0.0 {
        format!("{} minutes", secs / 60.0)
    } else if secs == 1.0 {
        "1 second".to_owned()
    } else {
        format!("{} seconds", (secs * 10.0).round() / 10.0)
    }
}

pub(crate) use engine::text::group_digits;

/// Decimal units, one decimal place: `52428800` → `52.4 MB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::{
        BinaryKind, Compression, FrameLibrary, ItemSizes, SheetShape, SkippedFile, SkippedRows,
    };

    fn rules(protocol: Protocol, code_and_final: CodeAndFinal) -> CompletionRules {
        CompletionRules {
            protocol,
            code_and_final,
        }
    }

    fn prompts(protocol: Protocol) -> Prompts {
        Prompts::new(
            PromptConfig::default(),
            rules(protocol, CodeAndFinal::AcceptUnlessError),
            20_000,
            30,
        )
    }

    pub(crate) fn sample_contexts() -> Vec<ContextMetadata> {
        let base = ContextMetadata {
            index: 0,
            name: "context_0".into(),
            kind: ContextKind::Text,
            source: "logs/app.log".into(),
            bytes: 52_428_800,
            chars: Some(52_428_800),
            rows: None,
            columns: None,
            items: None,
            item_sizes: None,
            load_ms: 12.5,
            frames: FrameLibrary::Polars,
            compression: None,
            empty: false,
            skipped_rows: None,
            skipped_files: Vec::new(),
            file_kinds: Vec::new(),
            sheets: Vec::new(),
        };
        vec![
            base.clone(),
            ContextMetadata {
                index: 1,
                name: "sales".into(),
                kind: ContextKind::Table,
                source: "sales.csv.gz".into(),
                bytes: 12_400_000,
                compression: Some(Compression::Gzip),
                skipped_rows: Some(SkippedRows {
                    count: 3,
                    first_line: 1_204,
                }),
                chars: None,
                rows: Some(1_203_344),
                columns: Some(vec![
                    (
                        "ts".into(),
                        "Datetime(time_unit='us', time_zone=None)".into(),
                    ),
                    ("service".into(), "String".into()),
                    ("amount".into(), "Float64".into()),
                ]),
                ..base.clone()
            },
            ContextMetadata {
                index: 2,
                name: "context_2".into(),
                kind: ContextKind::Json,
                source: "config.json".into(),
                bytes: 4_096,
                chars: Some(4_000),
                items: Some(12),
                ..base.clone()
            },
            ContextMetadata {
                index: 3,
                name: "context_3".into(),
                kind: ContextKind::JsonLines,
                source: "events.jsonl".into(),
                bytes: 900,
                items: Some(1),
                item_sizes: ItemSizes::from_sizes(vec![80]),
                ..base.clone()
            },
            ContextMetadata {
                index: 4,
                name: "context_4".into(),
                kind: ContextKind::Directory,
                source: "docs/".into(),
                bytes: 2_500_000_000,
                items: Some(3_100),
                item_sizes: ItemSizes::from_sizes(vec![12, 4_000, 1_048_576]),
                file_kinds: vec![(ContextKind::Text, 3_098), (ContextKind::Table, 2)],
                skipped_files: vec![SkippedFile {
                    path: "logo.png".into(),
                    kind: BinaryKind::Png,
                }],
                ..base.clone()
            },
            ContextMetadata {
                index: 5,
                name: "budget".into(),
                kind: ContextKind::Workbook,
                source: "budget.xlsx".into(),
                bytes: 20_480,
                chars: None,
                items: Some(2),
                frames: FrameLibrary::Pandas,
                sheets: vec![
                    SheetShape {
                        name: "2025".into(),
                        rows: 120,
                        columns: 4,
                    },
                    SheetShape {
                        name: "2026".into(),
                        rows: 80,
                        columns: 4,
                    },
                ],
                ..base.clone()
            },
            ContextMetadata {
                index: 6,
                name: "context_6".into(),
                source: "notes.txt".into(),
                bytes: 0,
                chars: Some(0),
                empty: true,
                ..base
            },
        ]
    }

    #[test]
    fn system_prompt_auto() {
        insta::assert_snapshot!(prompts(Protocol::Auto).system_prompt());
    }

    #[test]
    fn system_prompt_lists_the_sub_models_code_may_name() {
        let one = prompts(Protocol::Auto).with_sub_models(vec![("sub".into(), "small".into())]);
        let many = prompts(Protocol::Auto).with_sub_models(vec![
            ("sub".into(), "small-model".into()),
            ("big".into(), "large-model".into()),
        ]);
        let line = |p: &Prompts| {
            p.system_prompt()
                .lines()
                .skip_while(|l| !l.contains("`model`"))
                .take(2)
                .collect::<Vec<_>>()
                .join("\n")
        };
        insta::assert_snapshot!(format!("one:\n{}\n\nmany:\n{}", line(&one), line(&many)));
    }

    #[test]
    fn finish_instructions_per_protocol_and_policy() {
        let mut all = String::new();
        for protocol in [Protocol::Auto, Protocol::Final, Protocol::Answer] {
            for policy in [
                CodeAndFinal::AcceptUnlessError,
                CodeAndFinal::SeeOutputFirst,
                CodeAndFinal::Accept,
            ] {
                let p = Prompts::new(PromptConfig::default(), rules(protocol, policy), 20_000, 30);
                all.push_str(&format!("===== protocol {protocol}, {policy:?}\n"));
                all.push_str(&p.finish_instructions());
            }
        }
        insta::assert_snapshot!(all);
    }

    #[test]
    fn extension_is_appended_and_override_replaces() {
        let config = PromptConfig {
            extension: Some("\nDomain: these are nginx logs; status is field 9.\n\n".into()),
            ..PromptConfig::default()
        };
        let p = Prompts::new(config, CompletionRules::default(), 20_000, 30);
        let system = p.system_prompt();
        assert!(system.starts_with("You are the root model"));
        assert!(system.ends_with("\n\nDomain: these are nginx logs; status is field 9.\n"));

        let config = PromptConfig {
            system_override: Some("Be terse.\n{{finish_instructions}}\n{{unknown}}".into()),
            extension: Some("Logs.".into()),
            ..PromptConfig::default()
        };
        let p = Prompts::new(config, CompletionRules::default(), 20_000, 30);
        insta::assert_snapshot!(p.system_prompt());
    }

    #[test]
    fn first_message_describes_every_context_kind() {
        let p = prompts(Protocol::Auto);
        insta::assert_snapshot!(p.first_message(
            &sample_contexts(),
            "  Which service logged the most errors?\n"
        ));
    }

    #[test]
    fn session_facts_are_stated() {
        let session = SessionConfig {
            cell_timeout: Duration::from_secs(30),
            sub_call_errors: SubCallErrorMode::Raise,
            ..SessionConfig::default()
        };
        let system = prompts(Protocol::Auto)
            .with_session(&session)
            .system_prompt();
        assert!(
            system.contains("Each block may run for 30 seconds."),
            "{system}"
        );
        assert!(system.contains("raises `LlmQueryError`"), "{system}");
        assert!(!system.contains("instead of raising"), "{system}");
        assert_eq!(spoken_duration(Duration::from_secs(120)), "2 minutes");
        assert_eq!(spoken_duration(Duration::from_secs(1)), "1 second");
        assert_eq!(spoken_duration(Duration::from_millis(1_500)), "1.5 seconds");
    }

    #[test]
    fn no_context_is_said_plainly() {
        assert_eq!(
            describe_contexts(&[]),
            "# Context\n\nNo context was loaded; `context` is empty.\n"
        );
    }

    #[test]
    fn notes_and_fixed_messages() {
        let p = prompts(Protocol::Answer);
        let notes = [
            FinalNote::MissingName,
            FinalNote::MissingVariable {
                name: "result".into(),
            },
            FinalNote::EmptyValue {
                kind: FinalKind::FinalVarLine,
                name: Some("result".into()),
            },
            FinalNote::EmptyValue {
                kind: FinalKind::AnswerDict,
                name: None,
            },
            FinalNote::EmptyValue {
                kind: FinalKind::FinalLine,
                name: None,
            },
            FinalNote::Unclosed,
            FinalNote::Inactive {
                kind: FinalKind::FinalLine,
                protocol: Protocol::Answer,
            },
            FinalNote::Inactive {
                kind: FinalKind::AnswerDict,
                protocol: Protocol::Final,
            },
            FinalNote::SeeOutputFirst {
                kind: FinalKind::FinalVarLine,
            },
            FinalNote::HeldBackByError {
                kind: FinalKind::FinalLine,
            },
            FinalNote::CutOff,
        ];
        let mut all = String::new();
        for note in &notes {
            all.push_str(&format!("===== {note:?}\n{}", p.note(note)));
        }
        all.push_str(&format!("===== no code\n{}", p.no_code_nudge()));
        all.push_str(&format!("===== answer now\n{}", p.answer_now()));
        all.push_str(&format!("===== footer after 3\n{}", p.feedback_footer(3)));
        insta::assert_snapshot!(all);
    }

    #[test]
    fn every_placeholder_is_filled() {
        for protocol in [Protocol::Auto, Protocol::Final, Protocol::Answer] {
            let p = prompts(protocol);
            for text in [
                p.system_prompt(),
                p.first_message(&sample_contexts(), "q"),
                p.feedback_footer(1),
                p.note(&FinalNote::MissingVariable { name: "x".into() }),
                p.note(&FinalNote::Inactive {
                    kind: FinalKind::FinalLine,
                    protocol,
                }),
            ] {
                assert!(!text.contains("{{"), "unfilled placeholder in:\n{text}");
            }
        }
    }

    #[test]
    fn fill_is_one_pass_and_keeps_unknown_placeholders() {
        assert_eq!(
            fill("a {{x}} b {{y}} {{x", &[("x", "{{y}}")]),
            "a {{y}} b {{y}} {{x"
        );
        assert_eq!(fill("{{x}}{{x}}", &[("x", "1")]), "11");
    }

    #[test]
    fn number_formats() {
        assert_eq!(human_bytes(999), "999 bytes");
        assert_eq!(human_bytes(52_428_800), "52.4 MB");
        assert_eq!(human_bytes(2_500_000_000), "2.5 GB");
    }
}
