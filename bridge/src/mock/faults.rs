//! Fault decisions: deterministic rules first, then the seeded random rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use regex::Regex;

use super::config::{FaultKind, Faults};
use super::error::MockError;
use super::prompt::Prompt;

/// [`Faults`] with regexes compiled and per-rule hit counters.
#[derive(Debug)]
pub(crate) struct FaultPlan {
    rate: f64,
    kinds: Vec<FaultKind>,
    pub(crate) retry_after: Duration,
    pub(crate) hang: Duration,
    rules: Vec<CompiledRule>,
}

#[derive(Debug)]
struct CompiledRule {
    last_user: Option<Regex>,
    model: Option<Regex>,
    fault: FaultKind,
    times: Option<u64>,
    hits: AtomicU64,
}

impl FaultPlan {
    pub(crate) fn new(faults: &Faults) -> Result<Self, MockError> {
        faults.validate()?;
        let compile = |p: &Option<String>| -> Result<Option<Regex>, MockError> {
            p.as_deref()
                .map(|p| Regex::new(p).map_err(|e| MockError::InvalidConfig(e.to_string())))
                .transpose()
        };
        let rules = faults
            .rules
            .iter()
            .map(|r| {
                Ok(CompiledRule {
                    last_user: compile(&r.last_user)?,
                    model: compile(&r.model)?,
                    fault: r.fault,
                    times: r.times,
                    hits: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, MockError>>()?;
        Ok(Self {
            rate: faults.rate,
            kinds: faults.kinds.clone(),
            retry_after: faults.retry_after,
            hang: faults.hang,
            rules,
        })
    }

    /// The fault for one chat request, if any. Always draws exactly two numbers from `rng`,
    /// so later draws (latency) do not depend on whether a fault fired.
    pub(crate) fn decide(&self, prompt: &Prompt<'_>, rng: &mut impl Rng) -> Option<FaultKind> {
        let (roll, pick) = (rng.random::<f64>(), rng.random::<u64>());
        for rule in &self.rules {
            let hit = rule
                .model
                .as_ref()
                .is_none_or(|re| re.is_match(prompt.model))
                && rule
                    .last_user
                    .as_ref()
                    .is_none_or(|re| re.is_match(prompt.last_user));
            if !hit {
                continue;
            }
            match rule.times {
                None => return Some(rule.fault),
                Some(times) => {
                    if rule.hits.fetch_add(1, Ordering::Relaxed) < times {
                        return Some(rule.fault);
                    }
                }
            }
        }
        if self.rate > 0.0 && roll < self.rate && !self.kinds.is_empty() {
            let len = u64::try_from(self.kinds.len()).unwrap_or(u64::MAX);
            let idx = usize::try_from(pick % len).unwrap_or(0);
            return self.kinds.get(idx).copied();
        }
        None
    }
}
