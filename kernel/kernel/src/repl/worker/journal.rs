//! What a crashed worker's session is rebuilt from: the steps that changed its namespace, in
//! order — blocks that ran to completion (with or without a Python exception: what they set
//! before it stays), each with the record of its sub-calls' answers, answer-dict resets, and
//! support modules loaded for tools.
//!
//! Blocks that were interrupted or crashed are not kept: running them again would end the
//! same way. A block whose replay ends the worker again is marked and left out of later
//! replays.

use bridge::record::AnswerRecord;

use crate::repl::natives::SubAnswer;

/// One step of a session, as replayed.
#[derive(Debug, Clone)]
pub(crate) enum Entry {
    /// A block and the answers its sub-calls got.
    Block {
        /// The code.
        code: String,
        /// The answers, by what was asked.
        answers: AnswerRecord<SubAnswer>,
        /// Replaying it ended the worker: left out since.
        skipped: bool,
    },
    /// The `answer` dict was emptied (a new run of the session).
    ResetAnswer,
    /// A support module was loaded.
    Module {
        /// Its name.
        name: String,
        /// Its source.
        source: String,
    },
}

/// The steps of a session, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Vec<Entry>,
}

impl Journal {
    pub(crate) fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
    }

    /// The steps to replay now (a copy: replaying consumes the answer records).
    pub(crate) fn snapshot(&self) -> Vec<Entry> {
        self.entries.clone()
    }

    /// Leaves block `index` out of later replays.
    pub(crate) fn skip(&mut self, index: usize) {
        if let Some(Entry::Block { skipped, .. }) = self.entries.get_mut(index) {
            *skipped = true;
        }
    }

    /// Blocks left out.
    pub(crate) fn skipped(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Block { skipped: true, .. }))
            .count()
    }
}
