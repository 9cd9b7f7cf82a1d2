//! What a workflow file says: one struct per agent class, each refusing keys it does not know.
//!
//! The keys are those of ADK's Agent Config (1.x) — `agent_class`, `name`, `description`,
//! `model`, `instruction`, `tools`, `sub_agents`, `output_key`, `include_contents`,
//! `max_iterations`, `generate_content_config` and the `*_callbacks` lists — plus our own
//! classes (`GraphAgent`, `RouterAgent`, `RlmAgent`, `PythonAgent`) and a few keys of ours,
//! each documented on its field. Edge, successor and gate tests are [`Condition`]s.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;

use bridge::SamplingParams;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::condition::Condition;
use crate::flow::graph::BranchPolicy;

/// The class of an agent (`agent_class`; `LlmAgent` when absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AgentClass {
    /// A model with tools, on the function-calling loop.
    #[default]
    LlmAgent,
    /// Sub-agents in order, repeated up to `max_iterations`.
    LoopAgent,
    /// Sub-agents in order, once.
    SequentialAgent,
    /// Sub-agents concurrently.
    ParallelAgent,
    /// Sub-agents as nodes joined by `edges`.
    GraphAgent,
    /// Sub-agents as nodes routed by the control plane (the Scrum-Master router).
    RouterAgent,
    /// The RLM loop over the session's contexts (built by the kernel).
    RlmAgent,
    /// A Python function `(state) -> dict of updates` (built by the kernel).
    PythonAgent,
}

impl AgentClass {
    /// The name files use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlmAgent => "LlmAgent",
            Self::LoopAgent => "LoopAgent",
            Self::SequentialAgent => "SequentialAgent",
            Self::ParallelAgent => "ParallelAgent",
            Self::GraphAgent => "GraphAgent",
            Self::RouterAgent => "RouterAgent",
            Self::RlmAgent => "RlmAgent",
            Self::PythonAgent => "PythonAgent",
        }
    }
}

/// An agent name: an identifier (letters, digits, `_`, not starting with a digit), so it can
/// key branches, edges and tools.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct AgentName(String);

impl AgentName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AgentName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor, so that the parser points a bad name's error at the name itself.
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = AgentName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an agent name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<AgentName, E> {
                let mut chars = name.chars();
                let fine = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                if fine {
                    Ok(AgentName(name.to_owned()))
                } else {
                    Err(E::custom(format!(
                        "`{name}` is not a valid agent name; use letters, digits and `_`, \
                         starting with a letter"
                    )))
                }
            }
        }
        deserializer.deserialize_str(Name)
    }
}

/// A sub-agent defined in another file (`config_path`, relative to this file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubAgentRef {
    /// The file, relative to the file that names it.
    pub(crate) config_path: PathBuf,
}

/// A tool (`{name, args}`): a built-in, a registered tool, or another agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRef {
    /// The tool's name.
    pub name: String,
    /// Its settings.
    #[serde(default)]
    pub args: Map<String, Value>,
}

/// A callback (`{name, args}`): a registered Rust callback or a Python callable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeRef {
    /// Its name (`module.function` for Python).
    pub name: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Option<Value>,
}

/// Which conversation an LLM agent sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncludeContents {
    /// The run's conversation so far (input and other agents' messages).
    #[default]
    Default,
    /// Only its instruction and the current input.
    None,
}

/// Generation settings (`generate_content_config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationConfig {
    /// Sampling temperature.
    pub(crate) temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub(crate) top_p: Option<f32>,
    /// Maximum completion tokens.
    pub(crate) max_output_tokens: Option<u32>,
    /// Stop sequences.
    #[serde(default)]
    pub(crate) stop_sequences: Vec<String>,
    /// Sampling seed.
    pub(crate) seed: Option<u64>,
}

impl GenerationConfig {
    /// As the bridge's sampling parameters.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_output_tokens,
            stop: self.stop_sequences.clone(),
            seed: self.seed,
            extra: Map::new(),
        }
    }
}

/// The callbacks an agent names, by point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallbackRefs {
    /// `before_agent_callbacks`.
    pub(crate) before_agent: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    pub(crate) after_agent: Vec<CodeRef>,
    /// `before_model_callbacks`.
    pub(crate) before_model: Vec<CodeRef>,
    /// `after_model_callbacks`.
    pub(crate) after_model: Vec<CodeRef>,
    /// `on_model_error_callbacks`.
    pub(crate) on_model_error: Vec<CodeRef>,
    /// `before_tool_callbacks`.
    pub(crate) before_tool: Vec<CodeRef>,
    /// `after_tool_callbacks`.
    pub(crate) after_tool: Vec<CodeRef>,
    /// `on_tool_error_callbacks`.
    pub(crate) on_tool_error: Vec<CodeRef>,
}

impl CallbackRefs {
    /// Every callback named, with the point it is named for.
    pub fn all(&self) -> impl Iterator<Item = (&'static str, &CodeRef)> {
        [
            ("before_agent_callbacks", &self.before_agent),
            ("after_agent_callbacks", &self.after_agent),
            ("before_model_callbacks", &self.before_model),
            ("after_model_callbacks", &self.after_model),
            ("on_model_error_callbacks", &self.on_model_error),
            ("before_tool_callbacks", &self.before_tool),
            ("after_tool_callbacks", &self.after_tool),
            ("on_tool_error_callbacks", &self.on_tool_error),
        ]
        .into_iter()
        .flat_map(|(point, list)| list.iter().map(move |c| (point, c)))
    }
}

/// `LlmAgent`: a model with tools.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmAgentConfig {
    /// `LlmAgent` (or absent).
    #[serde(default)]
    pub(crate) agent_class: Option<AgentClass>,
    /// Its name.
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// The model: the name of a configured endpoint (absent: the default model).
    pub(crate) model: Option<String>,
    /// The agent of the workflow's agent bundle whose persona it plays (ours): `NAME` is
    /// the bundle's `agents/NAME.md`, or the skill `NAME` of a folder of skills or a project
    /// (a BMAD 6.1+ agent skill); one agent file or skill folder plays every `NAME`. Its
    /// persona goes before `instruction` and its tools (`load_workflow_file`, `load_skill`)
    /// may be named under `tools`.
    pub persona: Option<String>,
    /// The system instruction, a template over the state (`{key}`, `{key?}`).
    #[serde(default)]
    pub instruction: String,
    /// Its tools.
    #[serde(default)]
    pub tools: Vec<ToolRef>,
    /// The state key its final answer is written to.
    pub(crate) output_key: Option<String>,
    /// Which conversation it sees.
    #[serde(default)]
    pub include_contents: IncludeContents,
    /// Generation settings.
    #[serde(default)]
    pub generate_content_config: GenerationConfig,
    /// Model calls one turn may make (ours; default 50).
    pub(crate) max_iterations: Option<NonZeroU32>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
    /// `before_model_callbacks`.
    #[serde(default)]
    pub(crate) before_model_callbacks: Vec<CodeRef>,
    /// `after_model_callbacks`.
    #[serde(default)]
    pub(crate) after_model_callbacks: Vec<CodeRef>,
    /// `on_model_error_callbacks`.
    #[serde(default)]
    pub(crate) on_model_error_callbacks: Vec<CodeRef>,
    /// `before_tool_callbacks`.
    #[serde(default)]
    pub(crate) before_tool_callbacks: Vec<CodeRef>,
    /// `after_tool_callbacks`.
    #[serde(default)]
    pub(crate) after_tool_callbacks: Vec<CodeRef>,
    /// `on_tool_error_callbacks`.
    #[serde(default)]
    pub(crate) on_tool_error_callbacks: Vec<CodeRef>,
}

/// `LoopAgent`: sub-agents in order, repeated.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopAgentConfig {
    /// `LoopAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// Iterations at most (required: a loop never runs "forever").
    pub max_iterations: NonZeroU32,
    /// Its sub-agents, in order.
    pub(crate) sub_agents: Vec<SubAgentRef>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// `SequentialAgent`: sub-agents in order, once.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequentialAgentConfig {
    /// `SequentialAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// Its sub-agents, in order.
    pub(crate) sub_agents: Vec<SubAgentRef>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// `ParallelAgent`: sub-agents concurrently.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelAgentConfig {
    /// `ParallelAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// Its branches; their writes merge in this order.
    pub(crate) sub_agents: Vec<SubAgentRef>,
    /// What a failing branch does (ours): `fail_fast` (default) or `continue`.
    #[serde(default)]
    pub(crate) on_branch_failure: BranchPolicy,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// An edge of a `GraphAgent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EdgeConfig {
    /// The node it leaves.
    pub(crate) from: String,
    /// The node it leads to, or `END`.
    pub(crate) to: String,
    /// Taken only when this holds; a node's edges are tried in order, and one without
    /// `when` is taken when none before it held.
    #[serde(default)]
    pub(crate) when: Option<Condition>,
}

/// The target name that ends a graph.
pub const END: &str = "END";

/// `GraphAgent`: sub-agents as nodes joined by edges (ours).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphAgentConfig {
    /// `GraphAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// Its nodes.
    pub(crate) sub_agents: Vec<SubAgentRef>,
    /// The node that runs first.
    pub(crate) start: String,
    /// The edges; a node without one ends the graph.
    #[serde(default)]
    pub(crate) edges: Vec<EdgeConfig>,
    /// Node steps at most (default 1000).
    pub(crate) max_steps: Option<u64>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// When a router is consulted (`mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingMode {
    /// Every transition goes through the router.
    #[default]
    Active,
    /// The natural successors route; the router decides only on escalation, agent failure,
    /// a blocked gate or circular logic.
    Passive,
}

/// Where the topic of an LLM agent's message comes from (`topic`): exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "`{state_key: KEY}` or `{reply_field: FIELD}`"
)]
pub struct TopicSource {
    /// The value of this state key when the agent answers.
    pub state_key: Option<String>,
    /// This field of the agent's answer, when the answer is a JSON object.
    pub(crate) reply_field: Option<String>,
}

/// The natural successor of a router's node: a node name (or `END`), or branches tried in
/// order, the last one plain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SuccessorConfig {
    /// Always this node (or `END`).
    Node(String),
    /// The first branch whose `when` holds.
    Branches(Vec<BranchConfig>),
}

impl<'de> Deserialize<'de> for SuccessorConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor rather than `untagged`, so that a bad branch's error says what is wrong.
        struct Next;
        impl<'de> serde::de::Visitor<'de> for Next {
            type Value = SuccessorConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node name, or a list of `{when: CONDITION, to: NODE}` branches")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<SuccessorConfig, E> {
                Ok(SuccessorConfig::Node(name.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<SuccessorConfig, A::Error> {
                let branches =
                    Deserialize::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(SuccessorConfig::Branches(branches))
            }
        }
        deserializer.deserialize_any(Next)
    }
}

/// A mapping as its entries in file order (a key given twice is refused).
fn ordered_map<'de, D, V>(deserializer: D) -> Result<Vec<(String, V)>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Entries<V>(std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Entries<V> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of node names")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut entries: Vec<(String, V)> = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                if entries.iter().any(|(k, _)| *k == key) {
                    return Err(serde::de::Error::custom(format!("`{key}` is named twice")));
                }
                entries.push((key, map.next_value()?));
            }
            Ok(entries)
        }
    }
    deserializer.deserialize_map(Entries(std::marker::PhantomData))
}

/// One conditional branch of a [`SuccessorConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a branch `{when: CONDITION, to: NODE}`"
)]
pub struct BranchConfig {
    /// Taken when this holds (absent: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) when: Option<Condition>,
    /// The node, or `END`.
    pub(crate) to: String,
}

/// A quality gate of a router's node: a state test (`when`) or a Python check (`python`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a gate `{name: NAME, when: CONDITION}` or `{name: NAME, python: FUNCTION}`"
)]
pub struct GateConfig {
    /// Its name (`recovery` names a node per gate name).
    pub(crate) name: String,
    /// Whether a failure blocks the run (default) or is only recorded.
    #[serde(default = "blocking_by_default")]
    pub blocking: bool,
    /// The state must pass this test.
    pub(crate) when: Option<Condition>,
    /// A Python function `(state) -> bool | {passed, reason}` (`module.function` or
    /// `file.py:function`) must pass.
    pub python: Option<String>,
}

fn blocking_by_default() -> bool {
    true
}

/// How a router's node is retried when it fails transiently (`retry`; default 3 attempts,
/// waiting 1 s, doubling, at most 10 s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "`{attempts: N, initial: SECONDS, max: SECONDS}`"
)]
pub struct RetryConfig {
    /// Attempts in all (1: no retry).
    pub attempts: Option<NonZeroU32>,
    /// Seconds before the first retry.
    pub(crate) initial: Option<f64>,
    /// The longest wait, in seconds.
    pub(crate) max: Option<f64>,
}

/// A node of a router: its file, gates and retries.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a node `{config_path: FILE, gates: [...], retry: {...}}`"
)]
pub struct RouterNodeRef {
    /// The node's file, relative to the router's file.
    pub(crate) config_path: PathBuf,
    /// Gates checked after the node runs, in order.
    #[serde(default)]
    pub gates: Vec<GateConfig>,
    /// How it is retried.
    #[serde(default)]
    pub retry: RetryConfig,
}

/// `RouterAgent`: nodes routed by the control plane — escalation, circular logic, blocked
/// gates' recovery nodes, then natural successors (ours).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterAgentConfig {
    /// `RouterAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name (the `agent` of its decision records).
    pub(crate) name: AgentName,
    /// What it does.
    #[serde(default)]
    pub(crate) description: String,
    /// Its nodes, with their gates and retries.
    pub sub_agents: Vec<RouterNodeRef>,
    /// The node that runs first.
    pub start: String,
    /// `active` (default: every transition goes through the router) or `passive`.
    #[serde(default)]
    pub mode: RoutingMode,
    /// The natural successor of each node, in file order; a node without one ends the run.
    #[serde(default, deserialize_with = "ordered_map")]
    pub successors: Vec<(String, SuccessorConfig)>,
    /// The recovery node of each gate, by gate name.
    #[serde(default)]
    pub(crate) recovery: BTreeMap<String, String>,
    /// Where the topic of each LLM agent's message comes from (absent: no topic).
    pub topic: Option<TopicSource>,
    /// Exchanges between two agents on one topic before it is circular (default 3; more
    /// escalates).
    pub max_exchanges: Option<u32>,
    /// Node steps at most (default 1000).
    pub max_steps: Option<u64>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// `RlmAgent`: the RLM loop as an agent (ours; built by the kernel).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlmAgentConfig {
    /// `RlmAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub name: AgentName,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// The root model's endpoint (absent: the default model).
    pub model: Option<String>,
    /// The sub-model's endpoint for `llm_query` (absent: the default sub-model).
    pub sub_model: Option<String>,
    /// The query, a template over the state.
    pub instruction: String,
    /// The state key its final answer is written to.
    pub output_key: Option<String>,
    /// RLM iterations at most (absent: the RLM loop's default).
    pub max_iterations: Option<NonZeroU32>,
    /// Settings for the kernel's RLM agent.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
    /// `before_model_callbacks`.
    #[serde(default)]
    pub(crate) before_model_callbacks: Vec<CodeRef>,
    /// `after_model_callbacks`.
    #[serde(default)]
    pub(crate) after_model_callbacks: Vec<CodeRef>,
}

/// `PythonAgent`: a Python function `(state) -> dict of updates` (ours; built by the kernel).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonAgentConfig {
    /// `PythonAgent`.
    pub(crate) agent_class: AgentClass,
    /// Its name.
    pub name: AgentName,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// The function: `module.function`, or `file.py:function` relative to this file.
    pub function: String,
    /// Keyword arguments passed after the state.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// `before_agent_callbacks`.
    #[serde(default)]
    pub(crate) before_agent_callbacks: Vec<CodeRef>,
    /// `after_agent_callbacks`.
    #[serde(default)]
    pub(crate) after_agent_callbacks: Vec<CodeRef>,
}

/// One agent's settings, by class.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentConfig {
    /// `LlmAgent`.
    Llm(LlmAgentConfig),
    /// `LoopAgent`.
    Loop(LoopAgentConfig),
    /// `SequentialAgent`.
    Sequential(SequentialAgentConfig),
    /// `ParallelAgent`.
    Parallel(ParallelAgentConfig),
    /// `GraphAgent`.
    Graph(GraphAgentConfig),
    /// `RouterAgent`.
    Router(RouterAgentConfig),
    /// `RlmAgent`.
    Rlm(RlmAgentConfig),
    /// `PythonAgent`.
    Python(PythonAgentConfig),
}

impl AgentConfig {
    /// The agent's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Llm(c) => c.name.as_str(),
            Self::Loop(c) => c.name.as_str(),
            Self::Sequential(c) => c.name.as_str(),
            Self::Parallel(c) => c.name.as_str(),
            Self::Graph(c) => c.name.as_str(),
            Self::Router(c) => c.name.as_str(),
            Self::Rlm(c) => c.name.as_str(),
            Self::Python(c) => c.name.as_str(),
        }
    }

    /// What the agent does.
    pub fn description(&self) -> &str {
        match self {
            Self::Llm(c) => &c.description,
            Self::Loop(c) => &c.description,
            Self::Sequential(c) => &c.description,
            Self::Parallel(c) => &c.description,
            Self::Graph(c) => &c.description,
            Self::Router(c) => &c.description,
            Self::Rlm(c) => &c.description,
            Self::Python(c) => &c.description,
        }
    }

    /// Its class.
    pub fn class(&self) -> AgentClass {
        match self {
            Self::Llm(_) => AgentClass::LlmAgent,
            Self::Loop(_) => AgentClass::LoopAgent,
            Self::Sequential(_) => AgentClass::SequentialAgent,
            Self::Parallel(_) => AgentClass::ParallelAgent,
            Self::Graph(_) => AgentClass::GraphAgent,
            Self::Router(_) => AgentClass::RouterAgent,
            Self::Rlm(_) => AgentClass::RlmAgent,
            Self::Python(_) => AgentClass::PythonAgent,
        }
    }

    /// The files of its sub-agents.
    pub(crate) fn sub_agent_refs(&self) -> Vec<SubAgentRef> {
        match self {
            Self::Loop(c) => c.sub_agents.clone(),
            Self::Sequential(c) => c.sub_agents.clone(),
            Self::Parallel(c) => c.sub_agents.clone(),
            Self::Graph(c) => c.sub_agents.clone(),
            Self::Router(c) => c
                .sub_agents
                .iter()
                .map(|node| SubAgentRef {
                    config_path: node.config_path.clone(),
                })
                .collect(),
            Self::Llm(_) | Self::Rlm(_) | Self::Python(_) => Vec::new(),
        }
    }

    /// The callbacks it names.
    pub fn callbacks(&self) -> CallbackRefs {
        let agent = |before: &Vec<CodeRef>, after: &Vec<CodeRef>| CallbackRefs {
            before_agent: before.clone(),
            after_agent: after.clone(),
            ..CallbackRefs::default()
        };
        match self {
            Self::Llm(c) => CallbackRefs {
                before_agent: c.before_agent_callbacks.clone(),
                after_agent: c.after_agent_callbacks.clone(),
                before_model: c.before_model_callbacks.clone(),
                after_model: c.after_model_callbacks.clone(),
                on_model_error: c.on_model_error_callbacks.clone(),
                before_tool: c.before_tool_callbacks.clone(),
                after_tool: c.after_tool_callbacks.clone(),
                on_tool_error: c.on_tool_error_callbacks.clone(),
            },
            Self::Rlm(c) => CallbackRefs {
                before_model: c.before_model_callbacks.clone(),
                after_model: c.after_model_callbacks.clone(),
                ..agent(&c.before_agent_callbacks, &c.after_agent_callbacks)
            },
            Self::Loop(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
            Self::Sequential(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
            Self::Parallel(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
            Self::Graph(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
            Self::Router(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
            Self::Python(c) => agent(&c.before_agent_callbacks, &c.after_agent_callbacks),
        }
    }
}
