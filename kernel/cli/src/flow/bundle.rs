//! What a workflow's agents play and write with: the persona bundle (`--bundle PATH`, else
//! the `bundle/` folder beside the root workflow file, as the built-in `plan-discover` ships
//! its own) and the plan-and-discover tools (`engine::flow::discovery`). A `--bundle` that
//! no agent of the workflow could play from is a usage error, not silently ignored.

use std::path::{Path, PathBuf};

use anyhow::Result;
use engine::bundle::{PersonaBundle, StartOptions};
use engine::flow::file::{AgentConfig, AgentSpec, load_workflow};
use engine::flow::{Registry, with_discovery};

use super::workflow::Workflow;
use crate::exit::UsageError;

/// The folder beside a workflow file that holds its own persona bundle.
const BESIDE: &str = "bundle";

/// `registry` with the plan-and-discover tools and the run's persona bundle, if it has one.
pub(crate) fn extend(
    registry: Registry,
    bundle: Option<&Path>,
    workflow: &Workflow,
) -> Result<Registry> {
    let registry = with_discovery(registry);
    let path = match bundle {
        Some(path) if path.exists() => {
            let spec = load_workflow(workflow.root())?;
            if !plays_a_persona(&spec) {
                return Err(UsageError::new(format!(
                    "`--bundle {}` would be ignored: workflow `{}` has no agent with a \
                     `persona:` to play from a bundle; drop `--bundle`, or give an `LlmAgent` \
                     of the workflow a `persona: NAME` (as the built-in `plan-discover` does)",
                    path.display(),
                    spec.config.name()
                ))
                .into());
            }
            path.to_owned()
        }
        Some(path) => {
            return Err(UsageError::new(format!(
                "`--bundle {}` does not exist; pass an installed agent bundle's folder (the one \
                 holding `agents/`), one of its agent files (`agents/NAME.md`), a skill folder \
                 (one holding `SKILL.md`), a folder of skills, or a project with skills",
                path.display()
            ))
            .into());
        }
        None => match workflow.dir().join(BESIDE) {
            beside if beside.is_dir() => beside,
            _ => return Ok(registry),
        },
    };
    Ok(registry.with_bundle(PersonaBundle::new(path, StartOptions::default())))
}

/// The bundle a run's personas come from, for the output guard: `--bundle` when it exists,
/// else the `bundle/` folder beside the workflow, if there is one.
pub(crate) fn path_of(bundle: Option<&Path>, workflow: &Workflow) -> Option<PathBuf> {
    match bundle {
        Some(path) => Some(path.to_owned()).filter(|p| p.exists()),
        None => Some(workflow.dir().join(BESIDE)).filter(|p| p.is_dir()),
    }
}

/// Whether `spec` or an agent under it (a sub-agent or an agent used as a tool) is an
/// `LlmAgent` naming a `persona:`.
fn plays_a_persona(spec: &AgentSpec) -> bool {
    matches!(&spec.config, AgentConfig::Llm(c) if c.persona.is_some())
        || spec
            .sub_agents
            .iter()
            .chain(&spec.tool_agents)
            .any(plays_a_persona)
}
