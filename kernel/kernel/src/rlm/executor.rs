//! The code executor: runs the `repl` blocks of a reply, in order, in the session.

use std::sync::Arc;
use std::time::Instant;

use bridge::{BudgetLimit, CancellationToken};

use super::blocks::CodeBlock;
use super::hooks::{Hook, HookAction};
use super::metadata::{BlockRun, ChildRun};
use crate::repl::{ExecutionResult, ReplError, ReplSession};

/// Why the executor stopped before the last block.
#[derive(Debug)]
pub enum ExecutionStop {
    /// A hook stopped the run.
    Hook(String),
    /// A sub-call was refused by a budget `limit`; the blocks after this one did not run.
    Budget {
        /// The limit that refused it.
        limit: BudgetLimit,
        /// The refusal, as the sub-call's record has it.
        message: String,
    },
    /// The run's deadline passed.
    Deadline,
    /// The session itself failed (not the model's code).
    Kernel(ReplError),
}

/// The nodes of the `rlm_query` children that ended, taken after each block (the run's child
/// runner).
pub(crate) trait ChildNodes: Send + Sync + std::fmt::Debug {
    /// The children that ended since the last call, in the order they were started.
    fn take(&self) -> Vec<ChildRun>;
}

/// The blocks of a reply that ran, and why the rest did not.
#[derive(Debug)]
pub struct ExecutedReply {
    /// The blocks that ran (or that a hook answered for), in order, each with the `rlm_query`
    /// child runs it started.
    pub runs: Vec<BlockRun>,
    /// Set when not every block ran.
    pub stop: Option<ExecutionStop>,
}

/// Runs blocks in a [`ReplSession`].
#[derive(Debug, Clone)]
pub struct CodeExecutor {
    session: Arc<ReplSession>,
    stop: CancellationToken,
    /// The run's `rlm_query` children, when its depth allows them.
    children: Option<Arc<dyn ChildNodes>>,
}

impl CodeExecutor {
    /// An executor over `session`.
    pub fn new(session: Arc<ReplSession>) -> Self {
        Self::with_stop(session, CancellationToken::new())
    }

    /// The session.
    pub fn session(&self) -> &Arc<ReplSession> {
        &self.session
    }

    /// An executor whose blocks stop when `stop` is cancelled (the run's stop token): a stop
    /// that arrives while a block starts is never lost.
    pub fn with_stop(session: Arc<ReplSession>, stop: CancellationToken) -> Self {
        Self {
            session,
            stop,
            children: None,
        }
    }

    /// The same executor, attaching the children `runner` ran to the block that started them.
    pub(crate) fn with_children(mut self, runner: Option<Arc<dyn ChildNodes>>) -> Self {
        self.children = runner;
        self
    }

    /// Runs one block.
    pub fn execute(&self, block: &CodeBlock) -> Result<ExecutionResult, ReplError> {
        self.session.exec_until_stopped(&block.code, &self.stop)
    }

    /// Runs one block; if it is still running at `deadline`, interrupts it (with its in-flight
    /// sub-calls). The session stays usable for later blocks and runs.
    pub fn execute_until(
        &self,
        block: &CodeBlock,
        deadline: Option<Instant>,
    ) -> Result<ExecutionResult, ReplError> {
        let Some(deadline) = deadline else {
            return self.execute(block);
        };
        // The block's own stop: the run's, or the deadline, whichever comes first — latched,
        // so a deadline passing just before the block is armed still stops it at once.
        let stop = self.stop.child_token();
        let finished = CancellationToken::new();
        let watch = finished.clone();
        let session = Arc::clone(&self.session);
        let block_stop = stop.clone();
        crate::runtime::shared().spawn(async move {
            tokio::select! {
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                    block_stop.cancel();
                    session.interrupt();
                }
                () = watch.cancelled() => {}
            }
        });
        let result = self.session.exec_until_stopped(&block.code, &stop);
        finished.cancel();
        result
    }

    /// [`execute_until`](Self::execute_until), with the block named for the crash reporter
    /// ([`crate::fatal`]) while it runs.
    fn execute_named(
        &self,
        iteration: u32,
        block: &CodeBlock,
        deadline: Option<Instant>,
    ) -> Result<ExecutionResult, ReplError> {
        crate::fatal::set_running_block(iteration, block.index, &block.code);
        let outcome = self.execute_until(block, deadline);
        crate::fatal::clear_running_block();
        outcome
    }

    /// Runs `blocks` in order, with [`Hook::before_block`], [`Hook::after_block`] and
    /// [`Hook::on_sub_call`] around each. Stops early when a hook says so, when a sub-call was
    /// refused by a budget, when `deadline` has passed (a block still running then is interrupted, see
    /// [`execute_until`](Self::execute_until)), or when the session breaks.
    pub fn execute_all(
        &self,
        iteration: u32,
        blocks: Vec<CodeBlock>,
        hooks: &mut dyn Hook,
        deadline: Option<Instant>,
    ) -> ExecutedReply {
        let mut runs = Vec::with_capacity(blocks.len());
        for mut block in blocks {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return ExecutedReply {
                    runs,
                    stop: Some(ExecutionStop::Deadline),
                };
            }
            let result = match hooks.before_block(iteration, &mut block) {
                HookAction::Continue => match self.execute_named(iteration, &block, deadline) {
                    Ok(result) => result,
                    Err(error) => {
                        return ExecutedReply {
                            runs,
                            stop: Some(ExecutionStop::Kernel(error)),
                        };
                    }
                },
                HookAction::Replace(result) => result,
                HookAction::Stop(reason) => {
                    return ExecutedReply {
                        runs,
                        stop: Some(ExecutionStop::Hook(reason)),
                    };
                }
            };
            // The children's nodes join the run before the hooks see it: the live trace shows
            // them as the trajectory keeps them.
            let children = self
                .children
                .as_ref()
                .map(|runner| runner.take())
                .unwrap_or_default();
            let mut run = BlockRun {
                block,
                result,
                children,
            };
            hooks.after_block(iteration, &mut run);
            for call in &run.result.sub_calls {
                hooks.on_sub_call(iteration, call);
            }
            let refusal = run
                .result
                .sub_calls
                .iter()
                .find_map(|c| {
                    Some(ExecutionStop::Budget {
                        limit: c.error_kind?.budget_limit()?,
                        message: c.error.clone().unwrap_or_default(),
                    })
                })
                .or_else(|| {
                    run.children.iter().find_map(|node| {
                        Some(ExecutionStop::Budget {
                            limit: node.budget_limit()?,
                            message: node.budget_stop(iteration, run.block.index),
                        })
                    })
                });
            runs.push(run);
            if let Some(stop) = refusal {
                return ExecutedReply {
                    runs,
                    stop: Some(stop),
                };
            }
        }
        ExecutedReply { runs, stop: None }
    }
}
