//! The one interface of a run database, whichever holds it: [`Store`].
//!
//! The engine ([`run_durable`](super::run_durable)) and the `rlm flow` commands use a store
//! only through this trait, so an SQLite file and a PostgreSQL database are interchangeable
//! behind `--db`; one conformance suite (`durable/tests`) runs every behaviour below against
//! both. Its methods are `async`: PostgreSQL's are network round trips on a connection pool,
//! SQLite's run on tokio's blocking threads, so no checkpoint write ever holds up an async
//! worker thread.
//!
//! What every store guarantees:
//! - a checkpoint ([`put`](Store::put)) or a chain of them ([`put_chain`](Store::put_chain)),
//!   a status change and a release are each one transaction, which also checks the writer's
//!   [`Lease`] (fencing): a process whose lease was taken over, or ran out, writes nothing
//!   more;
//! - a claim is granted only over a holder that is gone (see [`LeaseHolder::liveness`]), or
//!   on request (`take_over`) over one that cannot be checked;
//! - reads see whole checkpoints only: a process killed mid-put leaves the last whole one.

use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;
use super::lease::{Claim, Lease, LeaseHolder, Owner};
use super::location::Location;
use super::record::{
    CheckpointId, CheckpointRecord, CheckpointState, NewCheckpoint, NewRun, PruneReport, RunRecord,
    RunStatus,
};
use crate::state::StateDelta;

/// A run database: runs, their checkpoints and leases. See the module docs.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Where it is (an SQLite path, or a PostgreSQL URL without its password).
    fn location(&self) -> &Location;

    /// How long a lease lasts without a [`heartbeat`](Self::heartbeat); `None` when it lasts
    /// until released (SQLite: the owner's pid is checked instead).
    fn lease_expiry(&self) -> Option<Duration>;

    /// Creates run `run.run_id` with status `running`, leased to `owner` in the same
    /// transaction ([`StoreError::DuplicateRun`] when the id is taken).
    async fn create_run(&self, run: &NewRun, owner: &Owner) -> Result<Lease, StoreError>;

    /// Claims run `run_id` for `owner`, in one transaction: granted when nobody holds it or
    /// its holder is gone (or cannot be checked, or renews its lease elsewhere, and
    /// `take_over` is set); refused ([`StoreError::Driven`], [`StoreError::DrivenElsewhere`],
    /// [`StoreError::Renewed`]) otherwise. A live holder on this host is never taken over.
    async fn claim(
        &self,
        run_id: &str,
        owner: &Owner,
        take_over: bool,
    ) -> Result<Claim, StoreError>;

    /// What [`claim`](Self::claim) would do, without writing: the holder it would replace,
    /// or its refusal (a check before starting anything costly; the claim checks again).
    async fn check_claim(
        &self,
        run_id: &str,
        take_over: bool,
    ) -> Result<Option<LeaseHolder>, StoreError>;

    /// Renews `lease` for another [`lease_expiry`](Self::lease_expiry); fails
    /// ([`StoreError::LeaseLost`], [`StoreError::LeaseExpired`]) when it is no longer the
    /// run's.
    async fn heartbeat(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Gives `lease` up (nothing happens when it was lost already).
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Sets the status of the run of `lease`, if the lease still holds, and with `release`
    /// gives the lease up in the same transaction. What [`set_status`](Self::set_status) and
    /// [`finish_run`](Self::finish_run) do.
    async fn write_status(
        &self,
        lease: &Lease,
        status: &RunStatus,
        release: bool,
    ) -> Result<(), StoreError>;

    /// Sets the status of the run of `lease`, if the lease still holds.
    async fn set_status(&self, lease: &Lease, status: &RunStatus) -> Result<(), StoreError> {
        self.write_status(lease, status, false).await
    }

    /// Sets the final status of the run of `lease` and releases it, in one transaction: the
    /// run stopped (completed, failed, waiting for a human, stopped by a limit or Ctrl-C).
    async fn finish_run(&self, lease: &Lease, status: &RunStatus) -> Result<(), StoreError> {
        self.write_status(lease, status, true).await
    }

    /// Writes a checkpoint of the run of `lease` in one transaction, if the lease still holds,
    /// and makes it the run's head.
    async fn put(
        &self,
        lease: &Lease,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<CheckpointId, StoreError> {
        let ids = self.put_chain(lease, vec![checkpoint]).await?;
        Ok(ids
            .last()
            .copied()
            .unwrap_or_else(|| unreachable!("`put_chain` returns the id of each checkpoint")))
    }

    /// Writes `checkpoints` of the run of `lease` as one chain in one transaction, if the lease
    /// still holds: each after the one before it (the first after its own parent; the parent
    /// the others name is not read), the last the run's head. Their ids, in order. A step
    /// that is two checkpoints (a node's and the routing decision after it) is written whole
    /// or not at all, for the price of one transaction.
    async fn put_chain(
        &self,
        lease: &Lease,
        checkpoints: Vec<NewCheckpoint<'_>>,
    ) -> Result<Vec<CheckpointId>, StoreError>;

    /// Run `run_id`, if it exists.
    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;

    /// Every run, oldest first.
    async fn runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// The checkpoints of run `run_id`, oldest first.
    async fn history(&self, run_id: &str) -> Result<Vec<CheckpointRecord>, StoreError>;

    /// Checkpoint `id`.
    async fn checkpoint(&self, id: CheckpointId) -> Result<CheckpointRecord, StoreError>;

    /// The writes of checkpoint `id`, in order.
    async fn writes(&self, id: CheckpointId) -> Result<StateDelta, StoreError>;

    /// The state at checkpoint `id`: its chain's snapshot with the writes since replayed.
    async fn state_at(&self, id: CheckpointId) -> Result<CheckpointState, StoreError>;

    /// Keeps the last `keep_last` (at least 1) checkpoints of run `run_id` and removes the
    /// older ones; a kept checkpoint whose chain would lose its snapshot takes one first.
    /// Refused while a process drives the run (its chain is not ours to cut).
    async fn prune(&self, run_id: &str, keep_last: usize) -> Result<PruneReport, StoreError>;
}
