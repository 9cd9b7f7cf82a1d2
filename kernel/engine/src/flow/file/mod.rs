//! Workflow files: ADK Agent Config (1.x) YAML read into a tree of [`AgentSpec`]s.
//!
//! [`load_workflow`] reads a file, reads its `agent_class` first (absent: `LlmAgent`), then
//! the whole file into that class's struct (`spec`), which refuses any key it does not
//! know. Each `sub_agents` entry's `config_path` is read relative to the file that names it,
//! from a [`FileSource`] (the file system, or [`EmbeddedFiles`] for built-in workflows).
//! Every error is a [`ConfigError`] naming the file, line and column and what was expected;
//! later checks (an unknown model or tool) point at their line through
//! [`AgentSpec::error_at`]. [`render_mermaid`] draws a tree as Mermaid text.
//!
//! ```
//! use engine::flow::file::{AgentConfig, EmbeddedFiles, load_workflow_from, render_mermaid};
//!
//! let files = EmbeddedFiles::new()
//!     .with("flows/refine.yaml", "agent_class: LoopAgent\nname: refine\nmax_iterations: 5\n\
//!                                 sub_agents:\n  - config_path: agents/critic.yaml\n")
//!     .with("flows/agents/critic.yaml", "name: critic\nmodel: root\n\
//!                                        instruction: Review {draft}.\noutput_key: review\n");
//! let spec = load_workflow_from(&files, "flows/refine.yaml").expect("valid files");
//! assert!(matches!(spec.config, AgentConfig::Loop(_)));
//! assert_eq!(spec.sub_agents[0].config.name(), "critic");
//! assert!(render_mermaid(&spec).contains("critic -. next iteration .-> refine__critic"));
//!
//! let typo = EmbeddedFiles::new().with("a.yaml", "name: a\nmodle: root\n");
//! let err = load_workflow_from(&typo, "a.yaml").expect_err("an unknown key");
//! assert!(err.to_string().starts_with("a.yaml:2:1: Unknown field `modle`, expected one of"));
//! ```

pub(crate) mod load;
pub(crate) mod mermaid;
pub(crate) mod spec;

pub(crate) use load::AGENT_TOOL;
pub use load::{
    AgentSpec, ConfigError, ConfigErrorKind, EmbeddedFiles, FileSource, Filesystem, load_workflow,
    load_workflow_from,
};
pub use mermaid::render_mermaid;
pub(crate) use spec::EdgeConfig;
pub use spec::{
    AgentClass, AgentConfig, AgentName, BranchConfig, CallbackRefs, CodeRef, END, GateConfig,
    GenerationConfig, GraphAgentConfig, IncludeContents, LlmAgentConfig, LoopAgentConfig,
    ParallelAgentConfig, PythonAgentConfig, RetryConfig, RlmAgentConfig, RouterAgentConfig,
    RouterNodeRef, RoutingMode, SequentialAgentConfig, SuccessorConfig, ToolRef, TopicSource,
};
