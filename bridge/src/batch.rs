//! Ordered, bounded fan-out: N requests in, N results out in input order.
//!
//! At most `concurrency` calls of one batch run at once (each one a tokio task, so the JSON
//! work spreads over the runtime's threads); the endpoint's limiter still caps what all
//! callers together have in flight. Each slot gets its own `Result`: a failure, a panic or a
//! cancellation touches only its slot, and every slot leaves one ledger record. Dropping the
//! batch future aborts its tasks; the calls they had started are recorded as cancelled and
//! the ones not yet started take no ledger index.
//!
//! The loop that starts each call as another ends is itself a task of the runtime, whoever
//! awaits the batch: a call that ends wakes it on the worker that ran the call, and the next
//! call starts there at once. Driven from a thread outside the runtime (the REPL's Python
//! thread or the CLI's main thread in `block_on`), every end of a call waited for that thread
//! to be woken and scheduled before the next could start, a pause of its own in every slot
//! of a wide batch, longest on a busy machine.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::chat::{ChatRequest, ChatResponse};
use crate::endpoint::{CallOptions, Endpoint, RecordedCall, Shared};
use crate::error::BridgeError;

/// How wide a batch fans out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPolicy {
    /// Calls of this batch in flight at once; `None` = all (still capped by `max_in_flight`).
    pub concurrency: Option<usize>,
}

impl BatchPolicy {
    /// At most `n` at once.
    pub fn bounded(n: usize) -> Self {
        Self {
            concurrency: Some(n),
        }
    }

    /// Everything at once (up to the endpoint's limiter).
    pub fn unbounded() -> Self {
        Self { concurrency: None }
    }
}

type Slot = Result<ChatResponse, BridgeError>;

impl Endpoint {
    /// Run `reqs` with bounded concurrency and return their results in input order.
    ///
    /// Cancelling `cancel` ends in-flight calls promptly; they and the calls not yet started
    /// come back as [`BridgeError::Cancelled`].
    pub async fn batch(
        &self,
        reqs: Vec<ChatRequest>,
        policy: BatchPolicy,
        cancel: &CancellationToken,
    ) -> Vec<Slot> {
        let opts = CallOptions {
            cancel: cancel.clone(),
            ..CallOptions::default()
        };
        self.batch_recorded(reqs, policy, &opts)
            .await
            .into_iter()
            .map(|call| call.result)
            .collect()
    }

    /// Like [`batch`](Self::batch), with every call's options (`stream` is ignored) and
    /// each slot's ledger record.
    pub async fn batch_recorded(
        &self,
        reqs: Vec<ChatRequest>,
        policy: BatchPolicy,
        opts: &CallOptions,
    ) -> Vec<RecordedCall> {
        let n = reqs.len();
        // Dropping this future drops the driver, and with it the calls in flight.
        let mut driver = AbortOnDrop(tokio::spawn(drive(
            Arc::clone(&self.shared),
            reqs,
            policy,
            CallOptions {
                stream: false,
                ..opts.clone()
            },
        )));
        match (&mut driver.0).await {
            Ok(slots) => slots,
            // The driver catches its calls' panics; if it failed all the same, every slot
            // says so (its calls recorded themselves when their tasks were dropped).
            Err(e) => (0..n)
                .map(|i| {
                    self.shared.unrecorded(
                        BridgeError::Internal(format!("batch item {i} produced no result: {e}")),
                        n,
                    )
                })
                .collect(),
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The batch loop: starts each call as another ends, at most `width` at once; slots in input
/// order.
async fn drive(
    shared: Arc<Shared>,
    reqs: Vec<ChatRequest>,
    policy: BatchPolicy,
    opts: CallOptions,
) -> Vec<RecordedCall> {
    let cancel = &opts.cancel;
    let n = reqs.len();
    let width = policy.concurrency.unwrap_or(n).clamp(1, n.max(1));
    let mut slots: Vec<Option<RecordedCall>> = Vec::with_capacity(n);
    slots.resize_with(n, || None);
    let mut pending = reqs.into_iter().enumerate();
    let mut tasks = JoinSet::new();
    let spawn = |tasks: &mut JoinSet<(usize, RecordedCall)>, index: usize, req: ChatRequest| {
        let shared = Arc::clone(&shared);
        let opts = opts.clone();
        tasks.spawn(async move {
            let call = shared.call(req, &opts, None, Some(n));
            let recorded = AssertUnwindSafe(call)
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    shared.unrecorded(
                        BridgeError::Internal(format!("the task of batch item {index} panicked")),
                        n,
                    )
                });
            (index, recorded)
        });
    };
    for (index, req) in pending.by_ref().take(width) {
        spawn(&mut tasks, index, req);
    }
    while let Some(joined) = tasks.join_next().await {
        // Tasks are never aborted and panics are caught inside, so a join error cannot
        // happen; if it did, its slot is reported below as missing.
        if let Ok((index, recorded)) = joined
            && let Some(slot) = slots.get_mut(index)
        {
            *slot = Some(recorded);
        }
        if cancel.is_cancelled() {
            for (index, req) in pending.by_ref() {
                let record = shared.record_unsent(&req, &BridgeError::Cancelled, opts.session, n);
                if let Some(slot) = slots.get_mut(index) {
                    *slot = Some(RecordedCall {
                        result: Err(BridgeError::Cancelled),
                        record,
                        answer: None,
                    });
                }
            }
        } else if let Some((index, req)) = pending.next() {
            spawn(&mut tasks, index, req);
        }
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| {
            slot.unwrap_or_else(|| {
                shared.unrecorded(
                    BridgeError::Internal(format!("batch item {i} produced no result")),
                    n,
                )
            })
        })
        .collect()
}
