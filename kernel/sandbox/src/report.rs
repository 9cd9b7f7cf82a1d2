//! Which confinement layers are in force, each with what it does or why it is missing.
//!
//! [`enter`](crate::enter) returns the [`Report`] of what it applied, and
//! [`probe`](crate::probe) the one it would apply here; `rlm doctor` prints it, `-v` prints
//! its [`summary`](Report::summary), and the default isolation prints
//! [`gaps`](Report::gaps) as one line.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One confinement layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Landlock: read only the system, Python and the contexts; write only the scratch dir.
    Filesystem,
    /// No network: an empty network namespace, IP sockets refused.
    Network,
    /// seccomp: no `ptrace`, `mount`, `bpf`, … ; no new privileges, not dumpable, no
    /// capabilities.
    Syscalls,
    /// rlimits: memory, CPU time, file size, open files.
    Limits,
    /// A cap on the processes and threads the confined code may hold.
    Processes,
    /// Every process the code starts dies with the worker; they run in a session of their
    /// own, without a controlling terminal.
    Lifetime,
    /// An environment holding only what Python needs.
    Environment,
}

impl Layer {
    /// Every layer, in report order.
    pub const ALL: [Layer; 7] = [
        Layer::Filesystem,
        Layer::Network,
        Layer::Syscalls,
        Layer::Limits,
        Layer::Processes,
        Layer::Lifetime,
        Layer::Environment,
    ];

    /// The layer's name as `rlm doctor` shows it.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Filesystem => "filesystem",
            Layer::Network => "network",
            Layer::Syscalls => "syscalls",
            Layer::Limits => "limits",
            Layer::Processes => "processes",
            Layer::Lifetime => "lifetime",
            Layer::Environment => "environment",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Whether a layer is in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum State {
    /// In force, as described.
    Active {
        /// What holds (mechanism and figures).
        detail: String,
    },
    /// In force in a weaker form.
    Partial {
        /// What holds.
        detail: String,
        /// What is missing and why.
        missing: String,
    },
    /// Not in force.
    Unavailable {
        /// Why, and what would make it available.
        reason: String,
    },
}

impl State {
    /// Whether the layer is fully in force.
    pub fn is_active(&self) -> bool {
        matches!(self, State::Active { .. })
    }
}

/// One layer and its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerReport {
    /// The layer.
    pub layer: Layer,
    /// Its state.
    #[serde(flatten)]
    pub state: State,
}

/// The state of every layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// One entry per layer, in [`Layer::ALL`] order.
    pub layers: Vec<LayerReport>,
}

impl Report {
    /// A report from one state per layer, in [`Layer::ALL`] order.
    pub(crate) fn new(states: impl IntoIterator<Item = (Layer, State)>) -> Self {
        let mut layers: Vec<LayerReport> = states
            .into_iter()
            .map(|(layer, state)| LayerReport { layer, state })
            .collect();
        layers.sort_by_key(|l| l.layer);
        Self { layers }
    }

    /// The state of one layer.
    pub fn state(&self, layer: Layer) -> Option<&State> {
        self.layers
            .iter()
            .find(|l| l.layer == layer)
            .map(|l| &l.state)
    }

    /// Whether every layer is fully in force (what `--isolation strict` demands).
    pub fn is_fully_confined(&self) -> bool {
        Layer::ALL
            .iter()
            .all(|layer| self.state(*layer).is_some_and(State::is_active))
    }

    /// The layers not fully in force.
    pub fn gaps(&self) -> impl Iterator<Item = &LayerReport> {
        self.layers.iter().filter(|l| !l.state.is_active())
    }

    /// One line: `confined: all 7 layers` or `not confined: network (reason); …`.
    pub fn summary(&self) -> String {
        if self.is_fully_confined() {
            return format!("confined: all {} layers in force", self.layers.len());
        }
        let gaps: Vec<String> = self
            .gaps()
            .map(|l| match &l.state {
                State::Partial { missing, .. } => format!("{} partly ({missing})", l.layer),
                State::Unavailable { reason } => format!("{} ({reason})", l.layer),
                State::Active { .. } => l.layer.to_string(),
            })
            .collect();
        format!("not confined: {}", gaps.join("; "))
    }
}

impl fmt::Display for Report {
    /// One line per layer: name, state, detail.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.layers {
            match &l.state {
                State::Active { detail } => writeln!(f, "{:<12} active       {detail}", l.layer)?,
                State::Partial { detail, missing } => writeln!(
                    f,
                    "{:<12} partial      {detail}; missing: {missing}",
                    l.layer
                )?,
                State::Unavailable { reason } => {
                    writeln!(f, "{:<12} unavailable  {reason}", l.layer)?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_active() -> Vec<(Layer, State)> {
        Layer::ALL
            .iter()
            .map(|l| {
                (
                    *l,
                    State::Active {
                        detail: "ok".into(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn summary_names_each_gap_with_its_reason() {
        let mut states = all_active();
        states[1].1 = State::Unavailable {
            reason: "no user namespaces".into(),
        };
        states[5].1 = State::Partial {
            detail: "subreaper".into(),
            missing: "no PID namespace".into(),
        };
        let report = Report::new(states);
        assert!(!report.is_fully_confined());
        assert_eq!(
            report.summary(),
            "not confined: network (no user namespaces); lifetime partly (no PID namespace)"
        );
        assert_eq!(
            Report::new(all_active()).summary(),
            "confined: all 7 layers in force"
        );
    }

    #[test]
    fn a_missing_layer_is_not_full_confinement() {
        let mut states = all_active();
        states.pop();
        assert!(!Report::new(states).is_fully_confined());
    }

    #[test]
    fn report_round_trips_through_json() {
        let mut states = all_active();
        states[0].1 = State::Unavailable {
            reason: "old kernel".into(),
        };
        let report = Report::new(states);
        let json = serde_json::to_string(&report).unwrap_or_default();
        assert!(
            json.contains(r#""layer":"filesystem","state":"unavailable","reason":"old kernel""#),
            "{json}"
        );
        let back: Report = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(back, report);
    }
}
