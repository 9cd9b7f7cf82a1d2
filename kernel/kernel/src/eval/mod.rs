//! Long-context evaluation tasks with exact scorers: what `rlm eval` runs through the RLM loop.
//!
//! # Pieces
//!
//! - Four task families ([`TaskKind`]), in the style of the RLM paper's benchmarks:
//!   **needle** (S-NIAH: key–value facts in a distractor text, one asked for; exact match),
//!   **aggregate** (OOLONG: customer messages whose [`CATEGORIES`] must be inferred; counts
//!   per category, partial credit `0.75^|error|` per count as OOLONG scores numbers) and
//!   **pairs** (OOLONG-Pairs: every pair of users who both sent a message of one category;
//!   F1 over pairs, order-insensitive), and **linked** (every pair of users who sent a
//!   message of one category on the same date: a relation between pairs of records, the task
//!   a deeper tree of `rlm_query` children is for; scored as pairs).
//! - [`TaskInstance::generate`] makes one instance — context, query, truth — from a kind, a
//!   size in tokens and a seed; the same arguments give the same instance in every version
//!   (the generators use their own fixed random stream). [`TaskInstance::score`] scores an
//!   answer: a [`Score`] in 0..=1 and whether it is exact.
//! - Sizes are in tokens, estimated as the bridge does when a server reports no usage: one
//!   token per 4 bytes of UTF-8 ([`estimate_tokens`]); the contexts are ASCII, so a size of
//!   `8k` is a context of about 32 000 characters (a generator stops at the line that reaches
//!   the size, or a few lines later to place the last facts).
//!
//! Nothing here needs Python or a model: the `rlm` binary runs the instances, and a Python
//! host or a benchmark can use the same tasks and scorers.
//!
//! # Example
//!
//! ```
//! use kernel::eval::{TaskInstance, TaskKind};
//!
//! let task = TaskInstance::generate(TaskKind::Needle, 8_000, 7);
//! assert!(task.context.len() >= 32_000);
//! let truth = task.truth.to_string();
//! assert!(task.score(Some(&format!("The number is {truth}."))).exact);
//! assert_eq!(task.score(None).value, 0.0);
//! ```

mod aggregate;
mod entries;
mod linked;
mod needle;
mod pairs;
mod rng;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use entries::{CATEGORIES, Category};
pub use needle::FACT_PREFIX;

use rng::SplitMix64;

/// A family of tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Find the value of one key among distractor text (exact match).
    Needle,
    /// Count messages per inferred category (OOLONG scoring).
    Aggregate,
    /// List every pair of users meeting a condition (F1 over pairs).
    Pairs,
    /// List every pair of users who sent a message of a category on the same date (F1 over
    /// pairs).
    Linked,
}

impl TaskKind {
    /// Every kind, in report order.
    pub const ALL: [TaskKind; 4] = [
        TaskKind::Needle,
        TaskKind::Aggregate,
        TaskKind::Pairs,
        TaskKind::Linked,
    ];

    /// The name the CLI and reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Needle => "needle",
            Self::Aggregate => "aggregate",
            Self::Pairs => "pairs",
            Self::Linked => "linked",
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of this module: input a user typed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// Not a task name.
    #[error("Unknown task `{0}`; the tasks are `needle`, `aggregate`, `pairs` and `linked`")]
    UnknownTask(String),
    /// Not a size.
    #[error(
        "`{0}` is not a context size; write a number of tokens, optionally with `k` or `m` \
         (thousands, millions), e.g. `8k`, `64k`, `1m`"
    )]
    BadSize(String),
}

impl FromStr for TaskKind {
    type Err = EvalError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| EvalError::UnknownTask(s.to_owned()))
    }
}

/// Parses a size in tokens: `8000`, `8k`, `1.5m` (k = 1 000, m = 1 000 000), at least 1.
pub fn parse_size(text: &str) -> Result<u64, EvalError> {
    let t = text.trim().to_ascii_lowercase();
    let (number, unit) = match t.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => match t.strip_suffix('m') {
            Some(n) => (n, 1e6),
            None => (t.as_str(), 1.0),
        },
    };
    number
        .trim()
        .parse::<f64>()
        .ok()
        .map(|n| (n * unit).round())
        .filter(|n| n.is_finite() && *n >= 1.0 && *n <= 1e12)
        .map(|n| n as u64)
        .ok_or_else(|| EvalError::BadSize(text.to_owned()))
}

/// A size as reports write it: `8k`, `1m`, `1.5m`, `900`.
pub fn format_size(tokens: u64) -> String {
    let short = |n: f64, unit: &str| {
        let text = format!("{n:.1}");
        format!("{}{unit}", text.trim_end_matches(".0"))
    };
    if tokens >= 1_000_000 && tokens.is_multiple_of(100_000) {
        short(tokens as f64 / 1e6, "m")
    } else if tokens >= 1_000 && tokens.is_multiple_of(100) {
        short(tokens as f64 / 1e3, "k")
    } else {
        tokens.to_string()
    }
}

/// Tokens in `text` as the bridge estimates them: one per 4 bytes of UTF-8, rounded up.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// The right answer of an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Truth {
    /// The asked key's value; the decoys are the other needles' values.
    Needle {
        /// The key the query names.
        key: String,
        /// Its value.
        value: String,
        /// The other facts' values (wrong answers).
        decoys: Vec<String>,
    },
    /// Messages per category.
    Aggregate {
        /// Category name → count.
        counts: BTreeMap<String, u64>,
    },
    /// Every qualifying pair, `(smaller, larger)` (the pairs and linked tasks).
    Pairs {
        /// The category both users sent.
        category: String,
        /// The pairs.
        pairs: BTreeSet<(u64, u64)>,
    },
}

impl fmt::Display for Truth {
    /// The truth written as a correct answer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Truth::Needle { value, .. } => f.write_str(value),
            Truth::Aggregate { counts } => {
                f.write_str(&serde_json::to_string(counts).map_err(|_| fmt::Error)?)
            }
            Truth::Pairs { pairs, .. } => {
                let lines: Vec<String> = pairs.iter().map(|(a, b)| format!("({a}, {b})")).collect();
                f.write_str(&lines.join("\n"))
            }
        }
    }
}

/// The score of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// 0 to 1: exact match (needle), OOLONG's partial credit (aggregate), F1 (pairs).
    pub value: f64,
    /// Whether the answer is entirely right.
    pub exact: bool,
}

/// One generated task: what the model gets and what it should answer.
#[derive(Debug, Clone)]
pub struct TaskInstance {
    /// Its family.
    pub kind: TaskKind,
    /// The size it was made for, in tokens.
    pub size_tokens: u64,
    /// The seed it was made from.
    pub seed: u64,
    /// The context, one text.
    pub context: String,
    /// The question.
    pub query: String,
    /// The right answer.
    pub truth: Truth,
}

impl TaskInstance {
    /// Makes the instance of `kind` at `size_tokens` for `seed` (one needle).
    pub fn generate(kind: TaskKind, size_tokens: u64, seed: u64) -> Self {
        Self::generate_with_needles(kind, size_tokens, seed, 1)
    }

    /// Like [`generate`](Self::generate), with `needles` facts in a needle task (the first
    /// asked for, the rest decoys; at least 1). Other kinds ignore `needles`.
    pub fn generate_with_needles(
        kind: TaskKind,
        size_tokens: u64,
        seed: u64,
        needles: usize,
    ) -> Self {
        let bytes = usize::try_from(size_tokens.saturating_mul(4)).unwrap_or(usize::MAX);
        let mut rng = SplitMix64::new(SplitMix64::mix(&[seed, kind as u64, size_tokens]));
        let (context, query, truth) = match kind {
            TaskKind::Needle => {
                let n = needle::generate(bytes, needles, &mut rng);
                let query = needle::query(&n.key);
                let truth = Truth::Needle {
                    key: n.key,
                    value: n.value,
                    decoys: n.decoys,
                };
                (n.context, query, truth)
            }
            TaskKind::Aggregate => {
                let (context, counts) = aggregate::generate(bytes, &mut rng);
                (context, aggregate::query(), Truth::Aggregate { counts })
            }
            TaskKind::Pairs => {
                let p = pairs::generate(bytes, &mut rng);
                let truth = Truth::Pairs {
                    category: CATEGORIES[p.category].name.to_owned(),
                    pairs: p.pairs,
                };
                (p.context, pairs::query(p.category), truth)
            }
            TaskKind::Linked => {
                let l = linked::generate(bytes, &mut rng);
                let truth = Truth::Pairs {
                    category: CATEGORIES[l.category].name.to_owned(),
                    pairs: l.pairs,
                };
                (l.context, linked::query(l.category), truth)
            }
        };
        Self {
            kind,
            size_tokens,
            seed,
            context,
            query,
            truth,
        }
    }

    /// Scores `answer` (`None`: the run gave none, which scores 0).
    pub fn score(&self, answer: Option<&str>) -> Score {
        let Some(answer) = answer else {
            return Score {
                value: 0.0,
                exact: false,
            };
        };
        let (value, exact) = match &self.truth {
            Truth::Needle { value, .. } => {
                let s = needle::score(answer, value);
                (s, s == 1.0)
            }
            Truth::Aggregate { counts } => aggregate::score(answer, counts),
            Truth::Pairs { pairs, .. } => pairs::score(answer, pairs),
        };
        Score { value, exact }
    }
}

/// The seed of instance `index` of a run seeded with `seed`: instances differ, and adding
/// instances (`--n`) keeps the earlier ones.
pub fn instance_seed(seed: u64, index: usize) -> u64 {
    SplitMix64::mix(&[seed, index as u64])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        for (text, tokens) in [
            ("8k", 8_000),
            ("64K", 64_000),
            ("1m", 1_000_000),
            ("1.5m", 1_500_000),
            (" 900 ", 900),
        ] {
            assert_eq!(parse_size(text), Ok(tokens), "{text}");
        }
        for bad in ["", "k", "0", "-8k", "8g", "1e20", "nan"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(format_size(8_000), "8k");
        assert_eq!(format_size(1_000_000), "1m");
        assert_eq!(format_size(1_500_000), "1.5m");
        assert_eq!(format_size(2_500), "2.5k");
        assert_eq!(format_size(1_234), "1234");
        assert_eq!("Pairs".parse(), Ok(TaskKind::Pairs));
        assert!(matches!(
            "nedle".parse::<TaskKind>(),
            Err(EvalError::UnknownTask(_))
        ));
    }

    #[test]
    fn instances_are_reproducible_and_sized() {
        for kind in TaskKind::ALL {
            let a = TaskInstance::generate(kind, 4_000, 1);
            let b = TaskInstance::generate(kind, 4_000, 1);
            let c = TaskInstance::generate(kind, 4_000, 2);
            assert_eq!(
                (&a.context, &a.query, &a.truth),
                (&b.context, &b.query, &b.truth)
            );
            assert_ne!(a.context, c.context, "{kind}");
            let tokens = estimate_tokens(&a.context);
            assert!((4_000..4_000 + 200).contains(&tokens), "{kind}: {tokens}");
            // The truth, written out, is a perfect answer.
            let score = a.score(Some(&a.truth.to_string()));
            assert!(score.exact && score.value == 1.0, "{kind}");
            assert!(!a.score(Some("")).exact);
        }
        assert_ne!(instance_seed(7, 0), instance_seed(7, 1));
    }
}
