//! Where a run stands in its nested graphs, and where a resumed run picks up.
//!
//! Graphs nest: a loop's node may be a sequence whose node is another loop. The executor runs
//! every node of a sequential, loop or graph container in a frame that records its
//! [`Position`] — the graph, the node, the graph's step count and its loop iteration — so a
//! node's path is the chain of positions from the root graph down to it
//! (`plan_discover[2]/discovery[3]/discoverer`: iteration 2 of the outer loop, iteration 3 of
//! the discovery loop, the discoverer). A checkpointer stores that path with each node's
//! writes.
//!
//! A [`ResumePoint`] is such a path read back: each level but the last re-enters its node —
//! a container — at its own step and iteration (no new iteration is counted, the limits
//! stay as they were), and the deepest level acts ([`ResumeAction`]): the node that finished
//! is followed by its edge (or its `exit_loop` / `escalate` is acted on), so only the node
//! that was running when the run stopped runs again. A parallel group's branches have no
//! position (they run concurrently; a group is resumed only at its boundary), nor has an
//! agent called as a tool: nodes below them have no path and are not resumed into.

use serde::{Deserialize, Serialize};

use super::control::Control;

/// One level of a run's position: graph `graph` runs node `node` as its `step`-th step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The graph's name.
    pub graph: String,
    /// The node it runs.
    pub node: String,
    /// Node steps the graph has run, this one included (1-based).
    pub step: u64,
    /// The loop iteration, when the graph is a loop (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
}

/// `path` as text: each graph with its loop iteration in brackets, then the deepest node
/// (`plan_discover[2]/discovery[3]/discoverer`).
pub fn path_text(path: &[Position]) -> String {
    let mut text = String::new();
    for level in path {
        text.push_str(&level.graph);
        if let Some(iteration) = level.iteration {
            text.push_str(&format!("[{iteration}]"));
        }
        text.push('/');
    }
    if let Some(last) = path.last() {
        text.push_str(&last.node);
    }
    text
}

/// What the deepest level of a [`ResumePoint`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAction {
    /// Run its node (it had not run yet).
    Run,
    /// Its node finished with this control: act on it, then follow the node's edge.
    After(Control),
    /// The graph at this level ends (nothing is left to run).
    End,
}

/// Where a resumed run picks up; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The positions from the root graph down (never empty for a point that resumes
    /// anything: an empty path starts the run afresh).
    pub path: Vec<Position>,
    /// What the deepest level does.
    pub action: ResumeAction,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_reads_from_the_root_down_with_loop_iterations() {
        let level = |graph: &str, node: &str, iteration| Position {
            graph: graph.into(),
            node: node.into(),
            step: 1,
            iteration,
        };
        let path = [
            level("outer", "steps", Some(2)),
            level("steps", "inner", None),
            level("inner", "work", Some(3)),
        ];
        assert_eq!(path_text(&path), "outer[2]/steps/inner[3]/work");
        assert_eq!(path_text(&[]), "");
    }
}
