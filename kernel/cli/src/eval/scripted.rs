//! `rlm eval --scripted`: mock models whose strategies are right for each task family.
//!
//! The root model (`scripted-root`) answers by rules: at turn 0 the query picks the family
//! (and hands the key or category to the code through a capture); the block prints
//! `plan: FAMILY`, which picks the family's second reply at turn 1: a fan-out with
//! `llm_query_batched` over chunks of whole lines, then aggregation in Python, then the
//! `answer` dict. The sub-model (`scripted-sub`) answers chunk questions from the text: it
//! extracts the asked key's fact (the mock's `extract`) or labels every message by the
//! categories' keywords (`label` per line). Asked directly with the context in the prompt
//! (the baseline), the root model can look a fact up in what it was given and answers
//! `unknown` to anything else.
//!
//! For `linked` the root's fan-out is `rlm_query_batched` over four shares of the dates (a
//! date's messages stay together). From `--max-depth 2` on, each share goes to a child RLM
//! played by the sub-model (recognised by the RLM system prompt), which labels its lines with
//! `llm_query_batched` and pairs each date's senders in Python. At depth 1 `rlm_query` is
//! `llm_query`: the sub-model, asked to relate a share's records in one reply, answers
//! `unknown` (and a share too large for its window, [`SUB_CONTEXT_WINDOW`], is refused before
//! it is sent). So `linked` scores 1 from depth 2 on and 0 at depth 1 ([`expected_score`]):
//! the scripted models play the finding that depth helps relation tasks (the RLM paper's
//! OOLONG-Pairs); real models (`--model`) measure it.

use kernel::eval::{CATEGORIES, FACT_PREFIX, TaskKind};
use serde_json::{Value, json};

/// The root model's name on the mock server.
pub(super) const ROOT_MODEL: &str = "scripted-root";
/// The sub-model's name.
pub(super) const SUB_MODEL: &str = "scripted-sub";

/// The sub-model's context window, as the mock server's model listing gives it (as vLLM
/// does): the context-window check refuses a sub-call that cannot fit it.
pub(super) const SUB_CONTEXT_WINDOW: u64 = 32_000;

/// The system prompt of a baseline request: how the scripted root model tells one apart.
pub(super) const BASELINE_SYSTEM: &str = "You answer a question about a document that the user \
gives you in the message. Answer with the answer only, in the format the question asks for.";

/// The score a scripted run of `kind` at `depth` must get: 1, but 0 for `linked` at depth 1
/// (see the module docs).
pub(super) fn expected_score(kind: TaskKind, depth: u32) -> f64 {
    if kind == TaskKind::Linked && depth < 2 {
        0.0
    } else {
        1.0
    }
}

const CHUNKING: &str = include_str!("scripted/chunks.py");

/// The mock script for every family.
pub(super) fn script() -> Value {
    let categories = serde_json::to_string(&CATEGORIES.iter().map(|c| c.name).collect::<Vec<_>>())
        .unwrap_or_default();
    let reply = |text: &str| {
        Value::String(
            text.replace("CHUNKING", CHUNKING.trim_end())
                .replace("CATEGORY_LIST", &categories),
        )
    };
    let fact = regex::escape(FACT_PREFIX);
    let asked_key = r"What is the special magic number for (?P<key>[a-z]+-[a-z]+)\?";
    let label_table: Vec<Value> = CATEGORIES
        .iter()
        .flat_map(|c| c.keywords.iter().map(|k| json!([k, c.name])))
        .collect();
    json!({
        "description": "Scripted models of `rlm eval --scripted`: see `kernel/cli/src/eval/scripted.rs`.",
        "models": {
            ROOT_MODEL: {
                "rules": [
                    {"system": format!("^{}", regex::escape(&BASELINE_SYSTEM[..30])), "last_user": asked_key,
                     "reply": {"behaviour": "extract", "pattern": format!("{fact}{{{{key}}}} is: (\\d+)"),
                               "default": "unknown"}},
                    {"system": format!("^{}", regex::escape(&BASELINE_SYSTEM[..30])), "reply": "unknown"},
                    {"turn": 0, "last_user": asked_key, "reply": reply(include_str!("scripted/needle-0.md"))},
                    {"turn": 0, "last_user": "Count the messages of each category",
                     "reply": reply(include_str!("scripted/aggregate-0.md"))},
                    {"turn": 0, "last_user": "sent at least one message of the category `(?P<category>[a-z]+)`",
                     "reply": reply(include_str!("scripted/pairs-0.md"))},
                    {"turn": 1, "last_user": "plan: needle", "reply": reply(include_str!("scripted/needle-1.md"))},
                    {"turn": 1, "last_user": "plan: aggregate", "reply": reply(include_str!("scripted/aggregate-1.md"))},
                    {"turn": 0, "last_user": "sent a message of the category `(?P<category>[a-z]+)` on the same date",
                     "reply": reply(include_str!("scripted/linked-0.md"))},
                    {"turn": 1, "last_user": "plan: pairs", "reply": reply(include_str!("scripted/pairs-1.md"))},
                    {"turn": 1, "last_user": "plan: linked", "reply": reply(include_str!("scripted/linked-1.md"))}
                ],
                "replies": ["This task is not one the scripted model knows.\n\nFINAL(unknown)"]
            },
            SUB_MODEL: {
                "context_window": SUB_CONTEXT_WINDOW,
                "rules": [
                    {"system": "recursive language model", "turn": 0,
                     "last_user": "sent a message of the category `(?P<category>[a-z]+)` on the same date",
                     "reply": reply(include_str!("scripted/linked-child-0.md"))},
                    {"system": "recursive language model", "turn": 1, "last_user": "linked part: ",
                     "reply": "FINAL_VAR(pairs_text)"},
                    {"last_user": r"(?s)^Find the special magic number for (?P<key>[a-z]+-[a-z]+) in this text\.[^\n]*\n\n(?P<body>.*)$",
                     "reply": {"behaviour": "extract", "input": "{{body}}",
                               "pattern": format!("{fact}{{{{key}}}} is: (\\d+)"), "default": "NONE"}},
                    {"last_user": r"(?s)^Classify each message below[^\n]*\n\n(?P<body>.*)$",
                     "reply": {"behaviour": "label", "per_line": true, "case_insensitive": true,
                               "input": "{{body}}", "table": label_table, "default": "unknown"}}
                ],
                "replies": ["unknown"]
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_compiles_and_names_both_models() {
        let script = bridge::mock::Script::from_json_value(script()).expect("a valid script");
        assert_eq!(script.model_names(), [ROOT_MODEL, SUB_MODEL]);
    }
}
