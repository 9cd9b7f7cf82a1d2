//! Starting an agent that is a skill: a BMAD 6.1+ agent (a skill whose customization has an
//! `[agent]` block, e.g. `.claude/skills/bmad-agent-pm`) plays its persona and menu; any other
//! skill is played as an assistant following it.
//!
//! Start-up does the activation steps that resolve or load files, as BMAD's `SKILL.md`
//! lists them, and nothing else:
//!
//! 1. *Resolve the agent block*: `customize.toml` merged with `_bmad/custom/<skill>.toml` and
//!    `_bmad/custom/<skill>.user.toml` (`customize`), in Rust rather than by
//!    `uv run resolve_customization.py`. `name` and `title` come from the skill's own file
//!    (BMAD treats them as its fixed identity); the rest — `icon`, `role`, `identity`,
//!    `communication_style`, `principles`, the prepend and append steps and the menu — from
//!    the merge.
//! 2. *Load persistent facts*: the block's `persistent_facts` (`facts`).
//! 3. *Load config*: the central config (`_bmad/config.toml`, `config.user.toml`,
//!    `custom/config*.toml`; its `[core]` and `[modules.*]` values) over the legacy
//!    `_bmad/<module>/config.yaml` files the instructions name; the values become variables,
//!    `output_folder` the folder documents are written to.
//!
//! The prepend steps, the greeting, the append steps and the menu are the model's, told in
//! the start-up message. The project root is the one given, else the working directory — or,
//! narrower, the nearest folder inside it above the skill that holds `_bmad/`; for a skill
//! outside the working directory, the nearest folder above it that holds `_bmad/` (never `/`
//! or the home directory), else the working directory. The tools read under the project,
//! the skill's folder and the folder of skills it is in, and the `--skills` folders.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::activate::activate_file;
use super::agent::{AgentCommand, AgentDefinition, AgentFormat, HandlerKind, Persona};
use super::customize::Layers;
use super::error::{BundleError, PathError};
use super::facts::Fact;
use super::prompt::{self, LoadedFile};
use super::sandbox::{DEFAULT_MAX_FILE_BYTES, Sandbox, SandboxPolicy};
use super::session::{BundleSession, Roots};
use super::skill::{SkillFile, SkillSet, project_skill_folders};
use super::started::{StartOptions, StartedAgent, output_folder, project_candidates};
use super::vars::today;
use super::yaml;

/// Starts the skill in the folder `dir` (canonical) as an agent.
pub(crate) fn start(dir: &Path, options: &StartOptions) -> Result<StartedAgent, BundleError> {
    let max_bytes = options.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES);
    let log = options.file_log.clone().unwrap_or_default();
    // The skill itself is the user's choice, wherever it is.
    let reader = Sandbox::new(&[dir.to_owned()], dir, dir)?
        .with_max_bytes(max_bytes)
        .with_policy(SandboxPolicy {
            allow_broad_roots: true,
            ..options.policy
        })
        .with_log(log.clone());
    let file = SkillFile::read(&reader, dir, "agent")?;

    let project = match &options.project_root {
        Some(root) => std::fs::canonicalize(root).map_err(|e| PathError::io(root, &e))?,
        None => infer_project_root(dir, &options.working_dir()?),
    };
    let user_skills = options.skill_folders()?;
    // The folder of skills this one is installed in: its menu's skills are there.
    let installed = dir.parent().map(Path::to_owned).filter(|p| p != &project);
    let mut read_roots = vec![project.clone(), dir.to_owned()];
    read_roots.extend(installed.iter().cloned());
    read_roots.extend(user_skills.iter().cloned());
    let sandbox = Sandbox::new(&read_roots, &project, &project)?
        .with_max_bytes(max_bytes)
        .with_policy(options.policy)
        .with_log(log);

    let bmad = project.join("_bmad");
    let roots = Roots {
        project: project.clone(),
        bundle: dir.to_owned(),
        core: if bmad.is_dir() { bmad } else { dir.to_owned() },
    };
    let mut vars = roots.variables(&options.date.clone().unwrap_or_else(today));
    vars.set("skill-root", dir.display().to_string());
    vars.set("skill-name", file.skill.name.clone());

    // Config: the legacy YAML files the instructions name, then the central config over them.
    let mut loaded = Vec::new();
    let mut configs = Vec::new();
    for reference in config_files(&file.body) {
        let path = vars.resolve(&reference)?;
        let (path, text) = match sandbox.read_text(&path, "start-up") {
            Ok(read) => read,
            Err(PathError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let entries = yaml::parse_mapping(&path, &text)?;
        let mut set = Vec::new();
        for (key, value) in &entries {
            if let Some(value) = yaml::scalar_text(value)
                && !is_root_variable(key)
            {
                vars.set(key.clone(), value);
                set.push(key.clone());
            }
        }
        configs.push(path.clone());
        loaded.push(LoadedFile {
            path,
            variables: set,
            content: None,
        });
    }
    let central = super::customize::load_central_config(&sandbox, &project, "start-up")?;
    if let Some(layers) = &central {
        let set = central_values(layers);
        for (key, value) in &set {
            vars.set(key.clone(), value.clone());
        }
        for path in &layers.files {
            configs.push(path.clone());
            loaded.push(LoadedFile {
                path: path.clone(),
                variables: set.iter().map(|(k, _)| k.clone()).collect(),
                content: None,
            });
        }
    }
    let output = output_folder(&mut vars, &project, &loaded)?;
    let sandbox = sandbox.with_write_root(Path::new(&output))?;

    let mut folders = user_skills;
    folders.extend(installed);
    folders.extend(project_skill_folders(&project));
    let skills = SkillSet::discover(
        &folders,
        std::slice::from_ref(&file.skill),
        &sandbox,
        "skills",
    );
    let session = BundleSession::new(roots, vars, sandbox).with_skills(skills);
    session.remember_central_config(central.map(Arc::new));
    let activation = activate_file(&session, file, "start-up")?;
    if let Some(layers) = &activation.customization {
        loaded.extend(layers.files.iter().map(|path| LoadedFile {
            path: path.clone(),
            variables: Vec::new(),
            content: None,
        }));
    }
    loaded.extend(fact_files(&activation.facts));

    let block = activation
        .customization
        .as_deref()
        .and_then(|layers| Some((layers, layers.merged.get("agent")?.as_object()?)));
    let vars = session.variables();
    let (definition, system_prompt, startup_message) = match block {
        Some((layers, block)) => {
            let definition = agent_definition(
                &activation.skill.file,
                &activation.skill.name,
                layers,
                block,
            )?;
            let system =
                prompt::skill_agent_prompt(&definition, &activation, &output, session.skills());
            let startup = prompt::skill_agent_startup(&activation, block, &configs, vars);
            (definition, system, startup)
        }
        None => {
            let skill = &activation.skill;
            let definition = AgentDefinition {
                path: skill.file.clone(),
                format: AgentFormat::Skill,
                id: Some(skill.name.clone()),
                name: skill.name.clone(),
                title: String::new(),
                icon: None,
                persona: Persona::default(),
                activation: Vec::new(),
                critical_actions: Vec::new(),
                rules: Vec::new(),
                commands: Vec::new(),
                prompts: Vec::new(),
            };
            let system = prompt::skill_play_prompt(&activation, &output, session.skills());
            let startup = prompt::skill_play_startup(&activation, vars);
            (definition, system, startup)
        }
    };
    Ok(StartedAgent {
        definition,
        session: Arc::new(session),
        loaded,
        system_prompt,
        startup_message,
        facts: activation.facts,
    })
}

/// The agent a BMAD `[agent]` block describes; `layers` give the skill's own defaults, from
/// which its fixed identity (`name`, `title`) comes.
fn agent_definition(
    file: &Path,
    skill: &str,
    layers: &Layers,
    block: &Map<String, Value>,
) -> Result<AgentDefinition, BundleError> {
    let invalid = |problem: String| BundleError::Customization {
        skill: skill.to_owned(),
        files: layers.files.clone(),
        problem,
    };
    let base = layers.base.get("agent").and_then(Value::as_object);
    let own = |key: &str| {
        base.and_then(|b| b.get(key))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let text = |key: &str| -> Result<String, BundleError> {
        match block.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.trim().to_owned()),
            Some(other) => Err(invalid(format!(
                "`agent.{key}` must be text, not `{other}`"
            ))),
        }
    };
    let principles = match block.get("principles") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_owned(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map_or_else(|| item.to_string(), str::to_owned)
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => {
            return Err(invalid(format!(
                "`agent.principles` must be a list of texts, not `{other}`"
            )));
        }
    };
    let menu = match block.get("menu") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(other) => {
            return Err(invalid(format!(
                "`agent.menu` must be a list of items (`[[agent.menu]]`), not `{other}`"
            )));
        }
    };
    let mut commands = Vec::with_capacity(menu.len());
    for item in &menu {
        let field = |key: &str| item.get(key).and_then(Value::as_str).map(str::trim);
        let code = field("code")
            .filter(|c| !c.is_empty())
            .ok_or_else(|| invalid(format!("an item of `agent.menu` has no `code`: `{item}`")))?;
        let handlers = match (field("skill"), field("prompt")) {
            (Some(skill), None) => vec![(HandlerKind::Skill, skill.to_owned())],
            (None, Some(prompt)) => vec![(HandlerKind::Action, prompt.to_owned())],
            (Some(_), Some(_)) => {
                return Err(invalid(format!(
                    "the menu item `{code}` has both `skill` and `prompt`; give it one of them"
                )));
            }
            (None, None) => {
                return Err(invalid(format!(
                    "the menu item `{code}` has neither `skill` nor `prompt`; give it one of them"
                )));
            }
        };
        commands.push(AgentCommand {
            trigger: code.to_owned(),
            aliases: Vec::new(),
            description: field("description").unwrap_or_default().to_owned(),
            handlers,
            // Merged from several files: no one line to point at.
            line: 0,
        });
    }
    Ok(AgentDefinition {
        path: file.to_owned(),
        format: AgentFormat::Skill,
        id: Some(skill.to_owned()),
        name: own("name").unwrap_or_else(|| skill.to_owned()),
        title: own("title").unwrap_or_default(),
        icon: Some(text("icon")?).filter(|i| !i.is_empty()),
        persona: Persona {
            role: text("role")?,
            identity: text("identity")?,
            communication_style: text("communication_style")?,
            principles,
        },
        activation: Vec::new(),
        critical_actions: Vec::new(),
        rules: Vec::new(),
        commands,
        prompts: Vec::new(),
    })
}

/// The `[core]` and `[modules.*]` values of the central config, as text.
fn central_values(layers: &Layers) -> Vec<(String, String)> {
    let mut values = Vec::new();
    let mut add = |table: &Map<String, Value>| {
        for (key, value) in table {
            if let Some(text) = yaml::scalar_text(value)
                && !is_root_variable(key)
            {
                values.retain(|(k, _): &(String, String)| k != key);
                values.push((key.clone(), text));
            }
        }
    };
    if let Some(core) = layers.merged.get("core").and_then(Value::as_object) {
        add(core);
    }
    if let Some(modules) = layers.merged.get("modules").and_then(Value::as_object) {
        for module in modules.values().filter_map(Value::as_object) {
            add(module);
        }
    }
    values
}

/// The config files the instructions name: `{project-root}/….yaml` paths ending in
/// `config.yaml` or `config.user.yaml`, in order, each once.
fn config_files(body: &str) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    for token in body.split(|c: char| c.is_whitespace() || "\"'`(),;<>".contains(c)) {
        let token = token.trim_end_matches(['.', ':', '!']);
        let named = token.starts_with("{project-root}/")
            && (token.ends_with("/config.yaml") || token.ends_with("/config.user.yaml"));
        if named && !files.iter().any(|f| f == token) {
            files.push(token.to_owned());
        }
    }
    files
}

/// The files the facts loaded, as start-up files.
fn fact_files(facts: &[Fact]) -> Vec<LoadedFile> {
    facts
        .iter()
        .flat_map(|fact| match fact {
            Fact::Files { files, .. } => files
                .iter()
                .map(|f| LoadedFile {
                    path: f.path.clone(),
                    variables: Vec::new(),
                    content: Some(f.content.clone()),
                })
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

fn is_root_variable(name: &str) -> bool {
    matches!(
        name,
        "project-root"
            | "project_root"
            | "bundle-root"
            | "core-root"
            | "skill-root"
            | "skill-name"
            | "date"
    )
}

/// The project of the skill in `dir` (see the module docs), `here` being the working
/// directory.
fn infer_project_root(dir: &Path, here: &Path) -> PathBuf {
    project_candidates(dir, here)
        .find(|a| a.join("_bmad").is_dir())
        .unwrap_or(here)
        .to_owned()
}
