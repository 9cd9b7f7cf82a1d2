//! Accounting: one [`SubCallMetadata`] per call, usage per model, and budgets.
//!
//! # Budget semantics
//!
//! A call is admitted before it is sent and holds a reservation until it ends:
//!
//! - `max_calls`: one slot per call (calls of endpoints that do not count toward it take
//!   none). A slot is spent once the call is sent and given back if the call ends (cancelled,
//!   dropped) before its first attempt, so the limit is exact under any concurrency.
//! - `max_iterations`: the same, one slot per call that is an iteration of an RLM loop (a
//!   root-model reply, [`CallOptions::iteration`](crate::CallOptions::iteration)), whichever
//!   loop of a tree of `rlm_query` children makes it.
//! - `max_tokens`: the call's estimate is `ceil(prompt_chars / 4)` plus the request's
//!   `max_tokens` (or the endpoint's default) when one is set. The call is admitted only if
//!   tokens used + tokens reserved by calls in flight + its estimate (at least 1) stay within
//!   the limit.
//! - `max_usd`: the same, with the estimate priced by the endpoint's [`Price`]
//!   (prompt tokens at the input price, `max_tokens` at the output price); without a price the
//!   estimate is 0 and a call is admitted while the recorded cost is below the limit.
//!
//! Each claim is one compare-and-swap on a counter of "used + reserved". When the call ends
//! its real usage is recorded, then its reservation released, so concurrent admissions never
//! see less than is spent. A budget can therefore only be overshot by what admitted calls
//! used beyond their estimates (e.g. completion tokens when no `max_tokens` is set). The
//! limits are claimed in the order tokens, USD, calls; a call refused by a later limit gives
//! its earlier claims straight back, and a concurrent call at the very edge of those limits
//! may be refused by that brief claim (never admitted beyond them).
//!
//! The hot path touches a few atomics (call index, budget claims) and one short `Mutex`
//! section to push the record; nothing is held across an await.
//!
//! # One ledger for a tree of runs
//!
//! A run and every `rlm_query` child it starts (at any depth) share one ledger, so the limits
//! hold for the whole tree: every call of every node is admitted against what the tree has
//! used plus what all its calls in flight have reserved, and a failed or cancelled call keeps
//! what it used. No node can spend what another has reserved or already spent. Each record
//! names the session whose code made it ([`SubCallMetadata::session`]), so a block's own calls
//! are told apart from those of the children that run while it waits ([`Ledger::records_of`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::config::Price;
use crate::error::{BudgetExceeded, BudgetLimit, FailureKind};
use crate::record::CacheUse;

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
    /// The kind of failure ([`BridgeError::kind`](crate::BridgeError::kind)) if the call failed.
    #[serde(default)]
    pub error_kind: Option<FailureKind>,
    /// The REPL session whose code made the call
    /// ([`CallOptions::session`](crate::CallOptions::session)), if a session did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    /// Set when the run's sub-call record answered the call without a request (`hit`), or
    /// after waiting for the same call in flight (`joined`): no tokens, no cost, no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheUse>,
}

/// Limits on the calls of one ledger; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    /// Maximum calls sent (exact under concurrency).
    pub max_calls: Option<u64>,
    /// Prompt plus completion tokens; a call is refused unless what is used, what calls in
    /// flight reserved and its own estimate fit (see the module docs).
    pub max_tokens: Option<u64>,
    /// Cost in USD, admitted like `max_tokens` with estimates priced by the endpoint's `Price`.
    pub max_usd: Option<f64>,
    /// Iterations (root-model replies) of every RLM loop sharing the ledger, a run and its
    /// `rlm_query` children together (exact under concurrency, like `max_calls`).
    pub max_iterations: Option<u64>,
}

/// The names messages use for the budget's limits, so a front end can name what its users
/// type (`` `--max-sub-calls` ``, `` `max_sub_calls` ``) instead of the [`Budget`]'s fields.
/// Unset names fall back to "`max_calls` of the budget" and the like.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetNames {
    /// What sets [`Budget::max_calls`].
    pub max_calls: Option<String>,
    /// What sets [`Budget::max_tokens`].
    pub max_tokens: Option<String>,
    /// What sets [`Budget::max_usd`].
    pub max_usd: Option<String>,
    /// What sets [`Budget::max_iterations`].
    pub max_iterations: Option<String>,
}

impl BudgetNames {
    /// The name of `limit`'s setting, if the front end gave one.
    pub fn of(&self, limit: BudgetLimit) -> Option<String> {
        match limit {
            BudgetLimit::Calls => self.max_calls.clone(),
            BudgetLimit::Tokens => self.max_tokens.clone(),
            BudgetLimit::Usd => self.max_usd.clone(),
            BudgetLimit::Iterations => self.max_iterations.clone(),
        }
    }
}

/// Aggregated usage of one model (or of everything, for [`Ledger::totals`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelUsage {
    /// Calls recorded (failed, refused and cached ones included).
    pub calls: u64,
    /// Calls answered from the run's sub-call record, without a request.
    #[serde(default)]
    pub cache_hits: u64,
    /// Calls that ended in an error.
    pub errors: u64,
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Cost in USD; `None` until a call with a price is recorded (no price given: unknown,
    /// not free).
    pub cost_usd: Option<f64>,
    /// Sum of call latencies.
    pub total_latency_ms: f64,
}

impl ModelUsage {
    // Token counts come from servers, so every sum saturates rather than overflows.
    fn add(&mut self, m: &SubCallMetadata) {
        self.calls = self.calls.saturating_add(1);
        self.cache_hits = self.cache_hits.saturating_add(u64::from(m.cache.is_some()));
        self.errors = self.errors.saturating_add(u64::from(m.error.is_some()));
        self.prompt_tokens = self.prompt_tokens.saturating_add(m.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(m.completion_tokens);
        self.cost_usd = add_cost(self.cost_usd, m.cost_usd);
        self.total_latency_ms += m.latency_ms;
    }

    fn merge(&mut self, o: &ModelUsage) {
        self.calls = self.calls.saturating_add(o.calls);
        self.cache_hits = self.cache_hits.saturating_add(o.cache_hits);
        self.errors = self.errors.saturating_add(o.errors);
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(o.completion_tokens);
        self.cost_usd = add_cost(self.cost_usd, o.cost_usd);
        self.total_latency_ms += o.total_latency_ms;
    }
}

/// A sum of costs where `None` is "no price given": known as soon as one part is.
pub fn add_cost(sum: Option<f64>, cost: Option<f64>) -> Option<f64> {
    match (sum, cost) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// What a call is expected to spend, reserved against the budget while it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CallEstimate {
    /// Prompt tokens (estimated from characters) plus `max_tokens` if set.
    pub(crate) tokens: u64,
    /// Those tokens priced, in nano-USD, rounded up.
    pub(crate) nano_usd: u64,
}

impl CallEstimate {
    /// The estimate of `prompt_chars` in and at most `max_tokens` out, priced by `price`.
    pub(crate) fn new(prompt_chars: usize, max_tokens: Option<u64>, price: Option<Price>) -> Self {
        let prompt = (prompt_chars as u64).div_ceil(4);
        let completion = max_tokens.unwrap_or(0);
        Self {
            tokens: prompt.saturating_add(completion),
            // A float-to-integer `as` saturates, so an absurd price cannot wrap.
            nano_usd: price.map_or(0, |p| (p.cost(prompt, completion) * NANO).ceil() as u64),
        }
    }
}

/// What a call claims when it is admitted: its estimate, and which slots it takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Claim {
    /// Tokens and cost it may spend.
    pub(crate) estimate: CallEstimate,
    /// Whether it takes a `max_calls` slot.
    pub(crate) counted: bool,
    /// Whether it takes a `max_iterations` slot.
    pub(crate) iteration: bool,
}

/// What one admitted call holds against the budget until [`Ledger::release`].
#[derive(Debug, Default)]
#[must_use = "a reservation must be released when its call ends"]
pub(crate) struct Reservation {
    call_slot: bool,
    iteration_slot: bool,
    tokens: u64,
    nano_usd: u64,
}

/// The concurrent sink of call records, with budget enforcement.
pub struct Ledger {
    budget: Budget,
    names: BudgetNames,
    next_index: AtomicU64,
    reserved_calls: AtomicU64,
    reserved_iterations: AtomicU64,
    tokens_used: AtomicU64,
    nano_usd_used: AtomicU64,
    /// Tokens used plus tokens reserved by calls in flight: what admission checks.
    tokens_committed: AtomicU64,
    /// The same for cost, in nano-USD.
    nano_usd_committed: AtomicU64,
    state: Mutex<LedgerState>,
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
            .field(
                "iterations_reserved",
                &self.reserved_iterations.load(Ordering::Relaxed),
            )
            .field("tokens_used", &self.tokens_used())
            .field("tokens_reserved", &self.tokens_reserved())
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
            names: BudgetNames::default(),
            next_index: AtomicU64::new(0),
            reserved_calls: AtomicU64::new(0),
            reserved_iterations: AtomicU64::new(0),
            tokens_used: AtomicU64::new(0),
            nano_usd_used: AtomicU64::new(0),
            tokens_committed: AtomicU64::new(0),
            nano_usd_committed: AtomicU64::new(0),
            state: Mutex::new(LedgerState::default()),
        }
    }

    /// This ledger with its limits named `names` in the messages of refused calls.
    #[must_use]
    pub fn with_names(mut self, names: BudgetNames) -> Self {
        self.names = names;
        self
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

    /// The records of calls made by `session`'s code with `call_index >= since`, in order:
    /// a block's own calls, without those of other sessions sharing the ledger meanwhile.
    pub fn records_of(&self, session: u64, since: u64) -> Vec<SubCallMetadata> {
        self.state()
            .records
            .range(since..)
            .filter(|(_, r)| r.session == Some(session))
            .map(|(_, r)| r.clone())
            .collect()
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

    /// What messages call its limits.
    pub fn names(&self) -> &BudgetNames {
        &self.names
    }

    /// Calls that reserved a budget slot (were or are being sent).
    pub fn calls_reserved(&self) -> u64 {
        self.reserved_calls.load(Ordering::Acquire)
    }

    /// Iterations that reserved a budget slot (were or are being sent).
    pub fn iterations_reserved(&self) -> u64 {
        self.reserved_iterations.load(Ordering::Acquire)
    }

    /// Prompt plus completion tokens recorded so far.
    pub fn tokens_used(&self) -> u64 {
        self.tokens_used.load(Ordering::Acquire)
    }

    /// Tokens reserved by calls in flight (their estimates).
    pub fn tokens_reserved(&self) -> u64 {
        self.tokens_committed
            .load(Ordering::Acquire)
            .saturating_sub(self.tokens_used())
    }

    /// Cost recorded so far, in USD.
    pub fn usd_used(&self) -> f64 {
        self.nano_usd_used.load(Ordering::Acquire) as f64 / NANO
    }

    /// Take the next call index.
    pub(crate) fn begin_call(&self) -> u64 {
        self.next_index.fetch_add(1, Ordering::AcqRel)
    }

    /// Admit one call, or say which limit refuses it (see the module docs). The reservation
    /// must be given back with [`release`](Self::release).
    pub(crate) fn reserve(&self, claim: Claim) -> Result<Reservation, BudgetExceeded> {
        let Claim {
            estimate,
            counted,
            iteration,
        } = claim;
        let mut reservation = Reservation::default();
        if let Some(max) = self.budget.max_tokens {
            self.claim(&self.tokens_committed, max, estimate.tokens)
                .map_err(|committed| BudgetExceeded {
                    limit: BudgetLimit::Tokens,
                    max: max as f64,
                    used: self.tokens_used() as f64,
                    reserved: committed.saturating_sub(self.tokens_used()) as f64,
                    needed: estimate.tokens as f64,
                    setting: self.names.of(BudgetLimit::Tokens),
                })?;
            reservation.tokens = estimate.tokens;
        }
        if let Some(max) = self.budget.max_usd {
            let max_nano = (max * NANO) as u64;
            if let Err(committed) =
                self.claim(&self.nano_usd_committed, max_nano, estimate.nano_usd)
            {
                self.release(reservation, false);
                let used = self.nano_usd_used.load(Ordering::Acquire);
                return Err(BudgetExceeded {
                    limit: BudgetLimit::Usd,
                    max,
                    used: used as f64 / NANO,
                    reserved: committed.saturating_sub(used) as f64 / NANO,
                    needed: estimate.nano_usd as f64 / NANO,
                    setting: self.names.of(BudgetLimit::Usd),
                });
            }
            reservation.nano_usd = estimate.nano_usd;
        }
        if iteration {
            if let Err(refused) =
                Self::take_slot(&self.reserved_iterations, self.budget.max_iterations)
            {
                self.release(reservation, false);
                return Err(refused.of(BudgetLimit::Iterations, &self.names));
            }
            reservation.iteration_slot = true;
        }
        if counted {
            if let Err(refused) = Self::take_slot(&self.reserved_calls, self.budget.max_calls) {
                self.release(reservation, false);
                return Err(refused.of(BudgetLimit::Calls, &self.names));
            }
            reservation.call_slot = true;
        }
        Ok(reservation)
    }

    /// Take one slot of `taken` if fewer than `max` are; `Err` has the limit and what was taken.
    fn take_slot(taken: &AtomicU64, max: Option<u64>) -> Result<(), SlotRefused> {
        let Some(max) = max else {
            taken.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        };
        taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(drop)
            .map_err(|used| SlotRefused { max, used })
    }

    /// Add `amount` to `committed` if it then stays within `max` (counting at least 1, so a
    /// spent budget refuses even a call estimated at nothing); `Err` has the value seen.
    fn claim(&self, committed: &AtomicU64, max: u64, amount: u64) -> Result<u64, u64> {
        committed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c.checked_add(amount.max(1))? <= max).then(|| c + amount)
        })
    }

    /// Give back what `reservation` holds; its `max_calls` slot only if the call was never
    /// `sent`. Call it after the call's record, so its real usage is counted first.
    pub(crate) fn release(&self, reservation: Reservation, sent: bool) {
        if reservation.tokens > 0 {
            saturating_sub(&self.tokens_committed, reservation.tokens);
        }
        if reservation.nano_usd > 0 {
            saturating_sub(&self.nano_usd_committed, reservation.nano_usd);
        }
        if reservation.call_slot && !sent {
            self.reserved_calls.fetch_sub(1, Ordering::AcqRel);
        }
        if reservation.iteration_slot && !sent {
            self.reserved_iterations.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Store one record and update the totals.
    pub(crate) fn record(&self, meta: SubCallMetadata) {
        let tokens = meta.prompt_tokens.saturating_add(meta.completion_tokens);
        if tokens > 0 {
            saturating_add(&self.tokens_used, tokens);
            saturating_add(&self.tokens_committed, tokens);
        }
        if let Some(cost) = meta.cost_usd.filter(|c| *c > 0.0) {
            // A float-to-integer `as` saturates (an infinite cost becomes `u64::MAX`).
            let nano = (cost * NANO).round() as u64;
            saturating_add(&self.nano_usd_used, nano);
            saturating_add(&self.nano_usd_committed, nano);
        }
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
}

/// A slot limit that was full: its value and the slots taken.
#[derive(Debug, Clone, Copy)]
struct SlotRefused {
    max: u64,
    used: u64,
}

impl SlotRefused {
    fn of(self, limit: BudgetLimit, names: &BudgetNames) -> BudgetExceeded {
        BudgetExceeded {
            limit,
            max: self.max as f64,
            used: self.used as f64,
            reserved: 0.0,
            needed: 0.0,
            setting: names.of(limit),
        }
    }
}

/// `counter += amount`, stopping at `u64::MAX` (server-reported usage can be anything).
fn saturating_add(counter: &AtomicU64, amount: u64) {
    // The closure always returns `Some`, so the update cannot fail.
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some(n.saturating_add(amount))
    });
}

/// `counter -= amount`, stopping at 0.
fn saturating_sub(counter: &AtomicU64, amount: u64) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some(n.saturating_sub(amount))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(tokens: u64) -> CallEstimate {
        CallEstimate {
            tokens,
            nano_usd: 0,
        }
    }

    /// A call counted toward `max_calls`, not an iteration.
    fn counted(estimate: CallEstimate) -> Claim {
        Claim {
            estimate,
            counted: true,
            iteration: false,
        }
    }

    #[test]
    fn reservations_count_until_released_and_unsent_slots_come_back() {
        let ledger = Ledger::new(Budget {
            max_calls: Some(2),
            max_tokens: Some(10),
            max_usd: None,
            max_iterations: None,
        });
        let a = ledger.reserve(counted(estimate(6))).expect("fits");
        let refused = ledger
            .reserve(counted(estimate(5)))
            .expect_err("6 + 5 > 10");
        assert_eq!(refused.limit, BudgetLimit::Tokens);
        assert_eq!(
            (refused.used, refused.reserved, refused.needed),
            (0.0, 6.0, 5.0)
        );
        assert!(
            refused
                .to_string()
                .contains("6 more reserved by calls in flight")
        );
        assert_eq!(ledger.calls_reserved(), 1, "a refused call holds no slot");
        let b = ledger.reserve(counted(estimate(4))).expect("6 + 4 fit");
        assert_eq!(ledger.tokens_reserved(), 10);
        ledger.release(b, false);
        assert_eq!(
            ledger.calls_reserved(),
            1,
            "an unsent call gives its slot back"
        );
        assert_eq!(ledger.tokens_reserved(), 6);
        ledger.release(a, true);
        assert_eq!((ledger.calls_reserved(), ledger.tokens_reserved()), (1, 0));
    }

    #[test]
    fn a_refusal_by_a_later_limit_gives_earlier_claims_back() {
        let ledger = Ledger::new(Budget {
            max_calls: Some(0),
            max_tokens: Some(10),
            max_usd: Some(1.0),
            max_iterations: None,
        });
        let refused = ledger
            .reserve(counted(CallEstimate {
                tokens: 3,
                nano_usd: 5,
            }))
            .expect_err("no calls allowed");
        assert_eq!(refused.limit, BudgetLimit::Calls);
        assert_eq!(ledger.tokens_reserved(), 0);
        assert_eq!(ledger.nano_usd_committed.load(Ordering::Acquire), 0);
        let root = ledger
            .reserve(Claim {
                estimate: estimate(10),
                counted: false,
                iteration: false,
            })
            .expect("uncounted calls skip max_calls");
        ledger.release(root, true);
    }

    #[test]
    fn iterations_take_slots_of_their_own_given_back_when_unsent() {
        let ledger = Ledger::new(Budget {
            max_calls: Some(1),
            max_iterations: Some(2),
            ..Budget::default()
        });
        let iteration = |counted| Claim {
            estimate: estimate(1),
            counted,
            iteration: true,
        };
        let a = ledger.reserve(iteration(false)).expect("first iteration");
        let b = ledger
            .reserve(iteration(true))
            .expect("a child's iteration on a counted endpoint");
        assert_eq!(
            (ledger.iterations_reserved(), ledger.calls_reserved()),
            (2, 1)
        );
        let refused = ledger.reserve(iteration(false)).expect_err("two of two");
        assert_eq!(refused.limit, BudgetLimit::Iterations);
        assert_eq!((refused.max, refused.used), (2.0, 2.0));
        ledger.release(b, false);
        assert_eq!(
            (ledger.iterations_reserved(), ledger.calls_reserved()),
            (1, 0),
            "an unsent call gives both slots back"
        );
        let refused = ledger
            .reserve(Claim {
                estimate: estimate(1),
                counted: true,
                iteration: true,
            })
            .and_then(|c| {
                ledger.release(c, true);
                ledger.reserve(Claim {
                    estimate: estimate(1),
                    counted: true,
                    iteration: false,
                })
            })
            .expect_err("the call slot is spent");
        assert_eq!(refused.limit, BudgetLimit::Calls);
        let no_calls = Ledger::new(Budget {
            max_calls: Some(0),
            max_iterations: Some(5),
            ..Budget::default()
        });
        let refused = no_calls
            .reserve(iteration(true))
            .expect_err("no sub-calls allowed");
        assert_eq!(refused.limit, BudgetLimit::Calls);
        assert_eq!(
            no_calls.iterations_reserved(),
            0,
            "a refusal by a later limit gives the iteration back"
        );
        ledger.release(a, true);
        assert_eq!(
            ledger.iterations_reserved(),
            2,
            "sent iterations stay spent"
        );
    }

    #[test]
    fn records_of_a_session_leave_out_other_sessions() {
        let ledger = Ledger::default();
        for (index, session) in [(0, Some(1)), (1, Some(2)), (2, None), (3, Some(1))] {
            let _ = ledger.begin_call();
            ledger.record(SubCallMetadata {
                call_index: index,
                endpoint: "sub".into(),
                model: "m".into(),
                prompt_chars: 0,
                response_chars: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
                tokens_estimated: false,
                latency_ms: 0.0,
                attempts: 1,
                batched: false,
                batch_size: 1,
                started_at_ms: 0,
                cost_usd: None,
                error: None,
                error_kind: None,
                session,
                cache: None,
            });
        }
        let of = |session, since| -> Vec<u64> {
            ledger
                .records_of(session, since)
                .iter()
                .map(|r| r.call_index)
                .collect()
        };
        assert_eq!(of(1, 0), [0, 3]);
        assert_eq!(of(1, 1), [3]);
        assert_eq!(of(2, 0), [1]);
    }

    #[test]
    fn estimates_price_prompt_and_max_tokens() {
        let price = Price {
            input_per_mtok: 1_000.0,
            output_per_mtok: 3_000.0,
        };
        let e = CallEstimate::new(40, Some(90), Some(price));
        assert_eq!(e.tokens, 100);
        assert_eq!(e.nano_usd, 280_000_000);
        assert_eq!(CallEstimate::new(41, None, None), estimate(11));
    }
}
