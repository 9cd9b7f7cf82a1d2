//! Agent bundles and skills: persona agents defined in files, loaded lazily, working through
//! tools.
//!
//! Two forms of agent load. A BMAD 6.0 bundle is a folder of agent files (`agents/*.md`: a
//! persona, start-up steps and a menu of commands in an `<agent>` XML block), a `config.yaml`
//! of values, and workflows (`workflow.yaml` naming instructions, a template and data files).
//! Since BMAD 6.1 every agent and workflow is an Agent Skill: a folder with `SKILL.md` (front
//! matter, then instructions) and a `customize.toml` that the team and each user override in
//! `_bmad/custom/`. Any agent may load the skills of the project and of `--skills` folders.
//! Pasting all of that into a prompt makes a model *describe* loading files instead of
//! loading them; here the model gets tools and loads each file only when a command needs it.
//!
//! The pieces, bottom up:
//!
//! - `error`: [`PathError`] (what the sandbox refuses), [`VariableError`] and
//!   [`BundleError`].
//! - `xml` / `agent`: the `<agent>` block parsed into an [`AgentDefinition`] — both the
//!   hand-written form (`<critical-actions>`, `<cmds>`) and the compiled form (numbered
//!   `<activation>` steps, `<menu>`); a malformed file is an error naming file and line.
//! - `vars`: [`Variables`], `{name}` references resolved when used (nested values,
//!   `{date}` and `{{date}}`, unknown names listed in the error).
//! - `sandbox`: [`Sandbox`], roots from the user and a [`SandboxPolicy`] in, a handle out
//!   that opens files only beneath the roots: every path checked on its canonical form
//!   against the read roots (bundle, core, project) or the write root (the output folder),
//!   then reached from a handle on the root without following a link (`openat2`), so a
//!   race fails closed. It refuses devices, pipes, NUL bytes, files over the size limit,
//!   hard-linked files, writes into `.git` and other version-control folders, and roots as
//!   broad as `/` or the home directory unless the user allows them; it records each access
//!   in a [`FileLog`].
//! - `skill`: `SKILL.md` parsed and checked as the Agent Skills specification says, and
//!   the [`SkillSet`] found in the skill folders (the catalog: names and descriptions).
//! - `customize`: BMAD's layers (a skill's `customize.toml` and its team and user
//!   overrides; the central `_bmad/config*.toml`) merged by shape, as its resolver does.
//! - `facts`: `persistent_facts` loaded — sentences, `file:` paths and globs, `skill:`s.
//! - `render`: the workflow and step files of a skill BMAD renders, filled in from the
//!   config and the customization as they are read.
//! - `yaml`, `session`: YAML mappings in file order; the [`BundleSession`] the tools
//!   share (roots, variables, sandbox, configs read once, the skills and those loaded).
//! - `activate`: a skill activated — instructions, customization, facts, workflow — for
//!   `load_skill` and for an agent that is a skill.
//! - `workflow`: `workflow.yaml` resolved and loaded with what it names, for
//!   `execute_workflow`.
//! - `prompt`: the system prompt, start-up message, command message and menu, worded in
//!   `prompts/agent/`.
//! - `tools`: `read_file`, `execute_workflow`, `save_output` and `load_workflow_file`;
//!   `skill_tools`: `load_skill` and `run_skill_script` (Python scripts, only through the
//!   `python` tool the user allowed).
//! - `started`: the [`StartedAgent`] and [`StartOptions`]; `format`: what a path given
//!   as an agent is (an error says what was found when it cannot be played).
//! - `skill_agent`: a skill started as an agent — a BMAD 6.1+ agent's merged `[agent]`
//!   block, facts and config, or any skill played as an assistant.
//! - `startup`: [`StartedAgent::start`] finds the agent's form; for an agent file it finds
//!   its roots, loads only the files its start-up steps name (a YAML file's values become
//!   variables; a failure halts start-up), lists the skills, and writes its opening
//!   messages.
//! - `persona`: [`PersonaBundle`], a bundle agent played by a workflow's LLM agent (its
//!   persona before the instruction, `load_workflow_file` reading only the bundle).
//! - `invoke`: `invoke_agent`, one agent asking another of the bundle (its own start-up
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

mod activate;
mod agent;
mod customize;
mod error;
mod facts;
mod format;
mod invoke;
mod persona;
mod prompt;
mod render;
mod sandbox;
mod session;
mod skill;
mod skill_agent;
mod skill_tools;
mod started;
mod startup;
mod tools;
mod vars;
mod workflow;
mod xml;
mod yaml;

pub use agent::{AgentCommand, AgentDefinition, AgentFormat, HandlerKind, Persona, Step};
pub use error::{Access, BroadRoot, BundleError, FileKind, PathError, VariableError};
pub use invoke::agent_tools;
pub(crate) use persona::PERSONA_TOOLS;
pub use persona::{PersonaAgent, PersonaBundle};
pub use prompt::LoadedFile;
pub use sandbox::{DEFAULT_MAX_FILE_BYTES, FileAccess, FileLog, FileOp, Sandbox, SandboxPolicy};
pub use session::{BundleSession, Roots};
pub use skill::{Skill, SkillNote, SkillSet};
pub use started::{StartOptions, StartedAgent};
pub use tools::ReadFile;
pub use vars::Variables;
