//! Agent bundles: persona agents defined in files, loaded lazily, working through tools.
//!
//! A bundle is a folder of agent files (`agents/*.md`: a persona, start-up steps and a menu
//! of commands in an `<agent>` XML block), a `config.yaml` of values, and workflows
//! (`workflow.yaml` naming instructions, a template and data files). Pasting all of that
//! into a prompt makes a model *describe* loading files instead of loading them; here the
//! model gets tools and loads each file only when a command needs it.
//!
//! The pieces, bottom up:
//!
//! - [`error`]: [`PathError`] (what the sandbox refuses), [`VariableError`] and
//!   [`BundleError`].
//! - `xml` / [`agent`]: the `<agent>` block parsed into an [`AgentDefinition`] — both the
//!   hand-written form (`<critical-actions>`, `<cmds>`) and the compiled form (numbered
//!   `<activation>` steps, `<menu>`); a malformed file is an error naming file and line.
//! - [`vars`]: [`Variables`], `{name}` references resolved when used (nested values,
//!   `{date}` and `{{date}}`, unknown names listed in the error).
//! - [`sandbox`]: [`Sandbox`], roots from the user and a [`SandboxPolicy`] in, a handle out
//!   that opens files only beneath the roots: every path checked on its canonical form
//!   against the read roots (bundle, core, project) or the write root (the output folder),
//!   then reached from a handle on the root without following a link (`openat2`), so a
//!   race fails closed. It refuses devices, pipes, NUL bytes, files over the size limit,
//!   hard-linked files, writes into `.git` and other version-control folders, and roots as
//!   broad as `/` or the home directory unless the user allows them; it records each access
//!   in a [`FileLog`].
//! - [`yaml`], [`session`]: YAML mappings in file order; the [`BundleSession`] the tools
//!   share (roots, variables, sandbox, configs read once).
//! - [`workflow`]: `workflow.yaml` resolved and loaded with what it names, for
//!   `execute_workflow`.
//! - [`prompt`]: the system prompt, start-up message, command message and menu, worded in
//!   `prompts/agent/`.
//! - [`tools`]: `read_file`, `execute_workflow`, `save_output` and `load_workflow_file`.
//! - [`startup`]: [`StartedAgent::start`] reads the agent, finds its roots, loads only the
//!   files its start-up steps name (a YAML file's values become variables; a failure halts
//!   start-up), and writes its opening messages.
//! - [`persona`]: [`PersonaBundle`], a bundle agent played by a workflow's LLM agent (its
//!   persona before the instruction, `load_workflow_file` reading only the bundle).
//! - [`invoke`]: `invoke_agent`, one agent asking another of the bundle (its own start-up
//!   and loop, on the same model and file log, at most two levels deep).
//!
//! ```no_run
//! use engine::bundle::{StartOptions, StartedAgent};
//!
//! let agent = StartedAgent::start(
//!     "project/bundle/module/agents/coach.md".as_ref(),
//!     &StartOptions::default(),
//! )?;
//! println!("{}", agent.menu());
//! let messages = agent.messages(); // system prompt + start-up message
//! let tools = agent.tools(); // read_file, execute_workflow, save_output
//! # let _ = (messages, tools);
//! // Only the agent file and its config were read so far.
//! assert_eq!(agent.session.file_log().len(), 2);
//! # Ok::<(), engine::bundle::BundleError>(())
//! ```

pub mod agent;
pub mod error;
pub mod invoke;
pub mod persona;
pub mod prompt;
pub mod sandbox;
pub mod session;
pub mod startup;
pub mod tools;
pub mod vars;
pub mod workflow;
mod xml;
pub mod yaml;

pub use agent::{AgentCommand, AgentDefinition, HandlerKind, Persona, Step};
pub use error::{Access, BroadRoot, BundleError, FileKind, PathError, VariableError};
pub use invoke::{InvokeAgent, agent_tools};
pub use persona::{PERSONA_TOOLS, PersonaAgent, PersonaBundle};
pub use prompt::LoadedFile;
pub use sandbox::{DEFAULT_MAX_FILE_BYTES, FileAccess, FileLog, FileOp, Sandbox, SandboxPolicy};
pub use session::{BundleSession, Roots};
pub use startup::{StartOptions, StartedAgent};
pub use tools::{ExecuteWorkflow, LoadWorkflowFile, ReadFile, SaveOutput, file_tools};
pub use vars::Variables;
