//! Health of a run: who hands work to whom, where time goes, what never ran.
//!
//! A [`HealthTracker`] is fed every node a run executes, in order, with its duration (the
//! executor's node observer does this); [`HealthTracker::report`] gives exchange counts per
//! pair of consecutive nodes, time and visits per node, the declared nodes that never ran
//! (idle), and the cycle time (the run's wall time, given by the caller). The report is
//! plain data for the run metrics (a durable run reports it). [`HealthObserver`] is the
//! node observer that feeds a tracker; [`HealthObserver::emit`] puts its report in the event
//! log (and `rlm view`) as one `health` metadata event — a durable routed run does so once
//! per invocation, however it ends (completed, failed, stopped for a human, at a limit,
//! cancelled).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::flow::{Event, FlowError, InvocationContext, NodeObserver, NodeRecord};

/// The topic of the metadata event carrying a graph's [`HealthReport`].
pub const HEALTH_TOPIC: &str = "health";

/// Hand-overs between one pair of nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairCount {
    /// The two nodes, in name order.
    pub pair: (String, String),
    /// Hand-overs in either direction.
    pub exchanges: u64,
}

/// The health of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    /// Exchanges per pair, most first.
    pub exchanges: Vec<PairCount>,
    /// Milliseconds spent in each node.
    pub(crate) time_in_node_ms: BTreeMap<String, u64>,
    /// Runs of each node.
    pub visits: BTreeMap<String, u64>,
    /// Declared nodes that never ran.
    pub idle_nodes: Vec<String>,
    /// The run's wall time in milliseconds.
    pub(crate) cycle_time_ms: u64,
}

/// Collects a run's health as its nodes finish.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthTracker {
    declared: BTreeSet<String>,
    time_in: BTreeMap<String, Duration>,
    visits: BTreeMap<String, u64>,
    exchanges: BTreeMap<(String, String), u64>,
    last: Option<String>,
}

impl HealthTracker {
    /// A tracker for a graph of `nodes`.
    pub(crate) fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        Self {
            declared: nodes.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Node `node` ran for `took`, after the node recorded before it.
    pub(crate) fn record(&mut self, node: &str, took: Duration) {
        *self.time_in.entry(node.to_owned()).or_default() += took;
        *self.visits.entry(node.to_owned()).or_default() += 1;
        if let Some(last) = self.last.replace(node.to_owned())
            && last != node
        {
            let pair = if last.as_str() < node {
                (last, node.to_owned())
            } else {
                (node.to_owned(), last)
            };
            *self.exchanges.entry(pair).or_default() += 1;
        }
    }

    /// The report, with `cycle_time` as the run's wall time.
    pub(crate) fn report(&self, cycle_time: Duration) -> HealthReport {
        let ms = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut exchanges: Vec<PairCount> = self
            .exchanges
            .iter()
            .map(|(pair, &exchanges)| PairCount {
                pair: pair.clone(),
                exchanges,
            })
            .collect();
        exchanges.sort_by(|a, b| b.exchanges.cmp(&a.exchanges).then(a.pair.cmp(&b.pair)));
        HealthReport {
            exchanges,
            time_in_node_ms: self
                .time_in
                .iter()
                .map(|(n, d)| (n.clone(), ms(d)))
                .collect(),
            visits: self.visits.clone(),
            idle_nodes: self
                .declared
                .iter()
                .filter(|n| !self.visits.contains_key(*n))
                .cloned()
                .collect(),
            cycle_time_ms: ms(&cycle_time),
        }
    }
}

/// A [`NodeObserver`] feeding a [`HealthTracker`] with the top-level nodes of graph `graph`
/// and their durations.
#[derive(Debug)]
pub(crate) struct HealthObserver {
    graph: String,
    started: Instant,
    /// The tracker, and the node running now with its start.
    inner: Mutex<(HealthTracker, Option<(String, Instant)>)>,
}

impl HealthObserver {
    /// Observes the top-level nodes of `graph` (declared nodes `nodes`), starting the cycle
    /// clock now.
    pub(crate) fn new<S: Into<String>>(
        graph: impl Into<String>,
        nodes: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            graph: graph.into(),
            started: Instant::now(),
            inner: Mutex::new((HealthTracker::new(nodes), None)),
        }
    }

    /// The report so far, the cycle time running from creation. A node still running (the
    /// run failed or was stopped in it) counts as visited, with its time so far.
    pub(crate) fn report(&self) -> HealthReport {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match &inner.1 {
            None => inner.0.report(self.started.elapsed()),
            Some((node, since)) => {
                let mut tracker = inner.0.clone();
                tracker.record(node, since.elapsed());
                tracker.report(self.started.elapsed())
            }
        }
    }

    /// Emits the report so far as a [`HEALTH_TOPIC`] metadata event of `ctx`.
    pub(crate) fn emit(&self, ctx: &InvocationContext) -> Result<(), FlowError> {
        let report = serde_json::to_value(self.report())
            .map_err(|e| FlowError::Sink(format!("Cannot record the run's health: {e}")))?;
        ctx.emit(Event::metadata(HEALTH_TOPIC, report))
    }
}

#[async_trait::async_trait]
impl NodeObserver for HealthObserver {
    fn node_started(&self, graph: &str, node: &str, _step: u64) {
        if graph == self.graph {
            self.inner.lock().unwrap_or_else(PoisonError::into_inner).1 =
                Some((node.to_owned(), Instant::now()));
        }
    }

    async fn node_finished(
        &self,
        _ctx: &InvocationContext,
        record: &NodeRecord,
    ) -> Result<(), FlowError> {
        if record.graph == self.graph {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let took = inner.1.take().map_or(Duration::ZERO, |(_, t)| t.elapsed());
            inner.0.record(&record.node, took);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchanges_time_visits_and_idle_nodes() {
        let mut health = HealthTracker::new(["analyst", "dev", "tea", "ux"]);
        let ms = Duration::from_millis;
        for (node, took) in [
            ("analyst", 5),
            ("dev", 10),
            ("tea", 3),
            ("dev", 10),
            ("tea", 4),
        ] {
            health.record(node, ms(took));
        }
        let report = health.report(ms(40));
        assert_eq!(
            report.exchanges,
            vec![
                PairCount {
                    pair: ("dev".into(), "tea".into()),
                    exchanges: 3
                },
                PairCount {
                    pair: ("analyst".into(), "dev".into()),
                    exchanges: 1
                },
            ]
        );
        assert_eq!(report.time_in_node_ms.get("dev"), Some(&20));
        assert_eq!(report.visits.get("tea"), Some(&2));
        assert_eq!(report.idle_nodes, vec!["ux".to_owned()]);
        assert_eq!(report.cycle_time_ms, 40);
    }
}
