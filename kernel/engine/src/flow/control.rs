//! How control goes on after an agent ran (its own module so that positions and node
//! records, which carry it, need nothing else of the agent machinery).

use crate::tool::Actions;
use serde::{Deserialize, Serialize};

/// How control goes on after an agent ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Control {
    /// The parent goes on with its next step.
    Continue,
    /// The nearest enclosing loop ends.
    ExitLoop,
    /// The whole invocation stops.
    Escalate,
}

impl Control {
    /// The control `actions` ask for (`escalate` over `exit_loop`; `end_turn` is the
    /// agent's own business and continues).
    pub fn from_actions(actions: Actions) -> Self {
        if actions.escalate {
            Self::Escalate
        } else if actions.exit_loop {
            Self::ExitLoop
        } else {
            Self::Continue
        }
    }

    /// The stronger of two (escalate over exit_loop over continue).
    pub(crate) fn max(self, other: Control) -> Control {
        Ord::max(self, other)
    }
}
