//! Accounting: one [`SubCallMetadata`] per call, usage per model, and budgets.
//!
//! The hot path touches three atomics (call index, call reservation, budget reads) and one
//! short `Mutex` section to push the record; nothing is held across an await.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use serde::{Deserialize, Serialize};

use crate::error::{BudgetExceeded, BudgetLimit};

/// What one model call did, recorded whether it succeeded or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubCallMetadata {
    /// Position in the ledger (0-based, in order of call start).
    pub call_index: u64,
    /// Endpoint name.
    pub endpoint: String,
    /// Model requested.
    pub model: String,
    /// Characters sent (message contents and tool arguments).
    pub prompt_chars: usize,
    /// Characters received (0 on error).
    pub response_chars: usize,
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Whether the token counts are estimated from characters.
    pub tokens_estimated: bool,
    /// Time from the first attempt to the end, retries included (queueing excluded).
    pub latency_ms: f64,
    /// HTTP attempts made (0 if the call was refused or cancelled before sending).
    pub attempts: u32,
    /// Whether the call was part of a batch.
    pub batched: bool,
    /// The size of that batch (1 for a single call).
    pub batch_size: usize,
    /// When the call started, in unix milliseconds.
    pub started_at_ms: u64,
    /// Cost in USD if the endpoint has a price.
    pub cost_usd: Option<f64>,
    /// The error message if the call failed.
    pub error: Option<String>,
    /// The error's short tag (`BridgeError::kind`) if the call failed.
    #[serde(default)]
    pub error_kind: Option<String>,
}

/// Limits on the calls of one ledger; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    /// Maximum calls sent (exact under concurrency).
    pub max_calls: Option<u64>,
    /// Calls are refused once recorded prompt+completion tokens reach this.
    pub max_tokens: Option<u64>,
    /// Calls are refused once recorded cost reaches this (needs a `Price`).
    pub max_usd: Option<f64>,
}

/// Aggregated usage of one model (or of everything, for [`Ledger::totals`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelUsage {
    /// Calls recorded (failed and refused ones included).
    pub calls: u64,
    /// Calls that ended in an error.
    pub errors: u64,
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Cost in USD (0 without a price).
    pub cost_usd: f64,
    /// Sum of call latencies.
    pub total_latency_ms: f64,
}

impl ModelUsage {
    fn add(&mut self, m: &SubCallMetadata) {
        self.calls += 1;
        self.errors += u64::from(m.error.is_some());
        self.prompt_tokens += m.prompt_tokens;
        self.completion_tokens += m.completion_tokens;
        self.cost_usd += m.cost_usd.unwrap_or(0.0);
        self.total_latency_ms += m.latency_ms;
    }

    fn merge(&mut self, o: &ModelUsage) {
        self.calls += o.calls;
        self.errors += o.errors;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.cost_usd += o.cost_usd;
        self.total_latency_ms += o.total_latency_ms;
    }
}

/// Called after each record is stored.
pub type LedgerObserver = Arc<dyn Fn(&SubCallMetadata) + Send + Sync>;

/// The concurrent sink of call records, with budget enforcement.
pub struct Ledger {
    budget: Budget,
    next_index: AtomicU64,
    reserved_calls: AtomicU64,
    tokens_used: AtomicU64,
    nano_usd_used: AtomicU64,
    state: Mutex<LedgerState>,
    observer: RwLock<Option<LedgerObserver>>,
}

#[derive(Default)]
struct LedgerState {
    /// Keyed by `call_index`: calls finish out of order, readers want ranges in order.
    records: BTreeMap<u64, SubCallMetadata>,
    by_model: BTreeMap<String, ModelUsage>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("budget", &self.budget)
            .field("calls_started", &self.next_call_index())
            .field(
                "calls_reserved",
                &self.reserved_calls.load(Ordering::Relaxed),
            )
            .field("tokens_used", &self.tokens_used())
            .finish_non_exhaustive()
    }
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new(Budget::default())
    }
}

const NANO: f64 = 1e9;

impl Ledger {
    /// An empty ledger enforcing `budget`.
    pub fn new(budget: Budget) -> Self {
        Self {
            budget,
            next_index: AtomicU64::new(0),
            reserved_calls: AtomicU64::new(0),
            tokens_used: AtomicU64::new(0),
            nano_usd_used: AtomicU64::new(0),
            state: Mutex::new(LedgerState::default()),
            observer: RwLock::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, LedgerState> {
        // A panic inside the short critical sections cannot leave the state half-written in a
        // way that matters for accounting, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// All records, in `call_index` order.
    pub fn records(&self) -> Vec<SubCallMetadata> {
        self.records_since(0)
    }

    /// Records with `call_index >= call_index`, in order.
    pub fn records_since(&self, call_index: u64) -> Vec<SubCallMetadata> {
        self.state()
            .records
            .range(call_index..)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// The index the next call will get, which is the number of calls started so far.
    pub fn next_call_index(&self) -> u64 {
        self.next_index.load(Ordering::Acquire)
    }

    /// Usage per model name.
    pub fn usage_by_model(&self) -> BTreeMap<String, ModelUsage> {
        self.state().by_model.clone()
    }

    /// Usage of all models together.
    pub fn totals(&self) -> ModelUsage {
        let state = self.state();
        let mut total = ModelUsage::default();
        for usage in state.by_model.values() {
            total.merge(usage);
        }
        total
    }

    /// The limits this ledger enforces.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Calls that reserved a budget slot (were or are being sent).
    pub fn calls_reserved(&self) -> u64 {
        self.reserved_calls.load(Ordering::Acquire)
    }

    /// Prompt plus completion tokens recorded so far.
    pub fn tokens_used(&self) -> u64 {
        self.tokens_used.load(Ordering::Acquire)
    }

    /// Cost recorded so far, in USD.
    pub fn usd_used(&self) -> f64 {
        self.nano_usd_used.load(Ordering::Acquire) as f64 / NANO
    }

    /// Install `f`, called after each record is stored (replaces any previous observer).
    pub fn set_observer(&self, f: Arc<dyn Fn(&SubCallMetadata) + Send + Sync>) {
        *self
            .observer
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(f);
    }

    /// Take the next call index.
    pub(crate) fn begin_call(&self) -> u64 {
        self.next_index.fetch_add(1, Ordering::AcqRel)
    }

    /// Reserve one call against the budget, or say which limit refuses it. An `uncounted`
    /// call (`counted == false`) is held to the token and USD limits only.
    pub(crate) fn reserve_call(&self, counted: bool) -> Result<(), BudgetExceeded> {
        if let Some(max) = self.budget.max_tokens {
            let used = self.tokens_used();
            if used >= max {
                return Err(BudgetExceeded {
                    limit: BudgetLimit::Tokens,
                    max: max as f64,
                    used: used as f64,
                });
            }
        }
        if let Some(max) = self.budget.max_usd {
            let used = self.usd_used();
            if used >= max {
                return Err(BudgetExceeded {
                    limit: BudgetLimit::Usd,
                    max,
                    used,
                });
            }
        }
        match self.budget.max_calls.filter(|_| counted) {
            None if !counted => Ok(()),
            None => {
                self.reserved_calls.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Some(max) => self
                .reserved_calls
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                })
                .map(|_| ())
                .map_err(|used| BudgetExceeded {
                    limit: BudgetLimit::Calls,
                    max: max as f64,
                    used: used as f64,
                }),
        }
    }

    /// Give back a reservation whose call was never sent (cancelled while queued).
    pub(crate) fn release_call(&self) {
        self.reserved_calls.fetch_sub(1, Ordering::AcqRel);
    }

    /// Store one record and update the totals.
    pub(crate) fn record(&self, meta: SubCallMetadata) {
        let tokens = meta.prompt_tokens + meta.completion_tokens;
        if tokens > 0 {
            self.tokens_used.fetch_add(tokens, Ordering::AcqRel);
        }
        if let Some(cost) = meta.cost_usd.filter(|c| *c > 0.0) {
            self.nano_usd_used
                .fetch_add((cost * NANO).round() as u64, Ordering::AcqRel);
        }
        let observer = self
            .observer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let for_observer = observer.as_ref().map(|_| meta.clone());
        {
            let mut state = self.state();
            match state.by_model.get_mut(&meta.model) {
                Some(usage) => usage.add(&meta),
                None => {
                    let mut usage = ModelUsage::default();
                    usage.add(&meta);
                    state.by_model.insert(meta.model.clone(), usage);
                }
            }
            state.records.insert(meta.call_index, meta);
        }
        if let (Some(observer), Some(meta)) = (observer, for_observer) {
            observer(&meta);
        }
    }
}
