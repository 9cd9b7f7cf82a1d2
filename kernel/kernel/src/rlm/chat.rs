//! Follow-up questions: [`RlmChat`] runs one question after another in the **same** REPL
//! session, so variables computed for one question are there for the next.
//!
//! Each question is a full run of the loop ([`Rlm::run`]'s rules, limits and hooks) with a fresh
//! conversation: the root model does not see earlier conversations, only a compact summary of
//! earlier questions, their answers and the variables their code made (what `rlm chat` and
//! successive notebook cells need). The summary is bounded: each question and answer is cut
//! head and tail, and only the most recent exchanges that fit in
//! [`RlmChat::with_summary_limit`] characters are kept (4 000 by default), the count of older
//! ones noted.
//!
//! ```no_run
//! # use kernel::rlm::{Rlm, RlmChat};
//! # fn chat(rlm: Rlm) -> Result<(), kernel::rlm::RlmError> {
//! let mut chat = RlmChat::new(rlm);
//! chat.ask("Load the errors per service into `errors`.")?;
//! let result = chat.ask("Which service in `errors` has the most?")?;
//! println!("{}", result.answer.unwrap_or_default());
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};

use super::feedback::truncate_middle;
use super::metadata::{RlmResult, TerminationReason};
use super::runner::{Rlm, RlmError};

/// Characters of the earlier-questions summary by default.
pub const DEFAULT_SUMMARY_CHARS: usize = 4_000;

/// Characters kept of one earlier question, and of one earlier answer.
const QUESTION_CHARS: usize = 300;
const ANSWER_CHARS: usize = 600;

/// One question asked in a chat and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    /// The question.
    pub question: String,
    /// The answer (a partial one when a limit stopped the run), if any.
    pub answer: Option<String>,
    /// Why its run ended.
    pub termination_reason: TerminationReason,
    /// Variables its code created, in order.
    pub variables_created: Vec<String>,
}

/// Questions one after another over one session; see the module docs.
#[derive(Debug)]
pub struct RlmChat {
    rlm: Rlm,
    exchanges: Vec<Exchange>,
    summary_chars: usize,
}

impl RlmChat {
    /// A chat over `rlm`'s session, with no question asked yet.
    pub fn new(rlm: Rlm) -> Self {
        Self {
            rlm,
            exchanges: Vec::new(),
            summary_chars: DEFAULT_SUMMARY_CHARS,
        }
    }

    /// Bounds the summary of earlier questions the root model sees (`0`: no summary).
    pub fn with_summary_limit(mut self, chars: usize) -> Self {
        self.summary_chars = chars;
        self
    }

    /// The runner, e.g. to add hooks or take a stop handle.
    pub fn rlm(&mut self) -> &mut Rlm {
        &mut self.rlm
    }

    /// The questions asked so far.
    pub fn exchanges(&self) -> &[Exchange] {
        &self.exchanges
    }

    /// Answers `question` in the shared session, the root model seeing [`RlmChat::summary`].
    pub fn ask(&mut self, question: &str) -> Result<RlmResult, RlmError> {
        let summary = self.summary();
        let result = self
            .rlm
            .run_with_earlier(question, (!summary.is_empty()).then_some(summary.as_str()))?;
        let mut variables_created: Vec<String> = Vec::new();
        for name in result
            .iterations
            .iter()
            .flat_map(|i| &i.execution.variables_created)
        {
            if !variables_created.contains(name) {
                variables_created.push(name.clone());
            }
        }
        self.exchanges.push(Exchange {
            question: question.trim().to_owned(),
            answer: result.answer.clone(),
            termination_reason: result.termination_reason,
            variables_created,
        });
        Ok(result)
    }

    /// The summary of earlier questions the next question's first message carries; empty
    /// before the first answer or with a limit of 0.
    pub fn summary(&self) -> String {
        // Newest first: the oldest exchanges are the first to go.
        let mut kept: Vec<String> = self
            .exchanges
            .iter()
            .enumerate()
            .rev()
            .map(|(n, exchange)| describe(n + 1, exchange))
            .collect();
        loop {
            let omitted = self.exchanges.len() - kept.len();
            let mut parts: Vec<String> = Vec::with_capacity(kept.len() + 1);
            if omitted > 0 {
                parts.push(format!("({omitted} earlier question(s) not shown)"));
            }
            parts.extend(kept.iter().rev().cloned());
            let text = parts.join("\n");
            if kept.is_empty() || text.chars().count() <= self.summary_chars {
                return if kept.is_empty() { String::new() } else { text };
            }
            kept.pop();
        }
    }
}

fn describe(n: usize, exchange: &Exchange) -> String {
    let answer = match &exchange.answer {
        Some(answer) if exchange.termination_reason.is_success() => {
            truncate_middle(answer.trim(), ANSWER_CHARS).into_owned()
        }
        Some(answer) => format!(
            "(partial; the run stopped: {}) {}",
            serde_json::to_value(exchange.termination_reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            truncate_middle(answer.trim(), ANSWER_CHARS)
        ),
        None => "(no answer)".to_owned(),
    };
    let mut entry = format!(
        "{n}. Q: {}\n   A: {answer}",
        truncate_middle(exchange.question.trim(), QUESTION_CHARS)
    );
    if !exchange.variables_created.is_empty() {
        let names = exchange.variables_created.join(", ");
        entry.push_str(&format!(
            "\n   Variables: {}",
            truncate_middle(&names, QUESTION_CHARS)
        ));
    }
    entry
}
