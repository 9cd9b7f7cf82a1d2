//! The skill tools: `load_skill(name)`, which activates a skill of the catalog (see
//! `activate`) and returns its instructions, and `run_skill_script(script, args)`, which
//! runs a Python script of a skill's `scripts/` folder (or one of BMAD's shared
//! `_bmad/scripts/`) — only through the `python` tool, and only when the user allowed Python
//! (`rlm agent --python`). Without it the call fails with an error that says so, which the
//! model can act on (do the work by hand, or tell the user); no script ever runs otherwise.
//!
//! The script is read through the bundle sandbox like any other file (inside its roots, no
//! link out, no hard-linked file, within the size limit, recorded in the file log), and the
//! text that was read is what runs: Python is never handed a path to open by itself, so a
//! file swapped after the check, or a hard link to a file outside the roots, cannot run (nor
//! leak its lines through a traceback). It runs in the Python session the `python` tool uses
//! (confined as that session is) as `__main__`, with `__file__` and `sys.argv` set to the
//! script and its arguments and its own folder first on `sys.path` (so it imports its
//! sibling modules, which Python reads itself, under the session's confinement), all
//! restored afterwards; what it prints comes back, and a non-zero exit code is reported.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::activate::activate;
use super::error::{BundleError, list_names};
use super::session::BundleSession;
use super::skill::no_skill;
use crate::tool::{Tool, ToolContext, ToolError};

/// The note for a skill cut in a tool result.
const SKILL_CUT: &str = "The skill is returned whole or not at all: work from its head and \
                         tail, and read the files it names with `read_file`";

/// `load_skill` and `run_skill_script` over `session`'s skills (none when it has no
/// skills); scripts run through `python` when given.
pub(crate) fn skill_tools(
    session: &Arc<BundleSession>,
    python: Option<Arc<dyn Tool>>,
) -> Vec<Arc<dyn Tool>> {
    if session.skills().is_empty() {
        return Vec::new();
    }
    vec![
        Arc::new(LoadSkill::new(Arc::clone(session))),
        Arc::new(RunSkillScript::new(Arc::clone(session), python)),
    ]
}

/// `load_skill`: a skill's instructions, its resolved customization and facts, and its
/// workflow, by name.
#[derive(Debug, Clone)]
pub(crate) struct LoadSkill {
    session: Arc<BundleSession>,
}

impl LoadSkill {
    /// The tool over `session`'s skills.
    pub(crate) fn new(session: Arc<BundleSession>) -> Self {
        Self { session }
    }
}

#[async_trait]
impl Tool for LoadSkill {
    fn name(&self) -> &str {
        "load_skill"
    }

    fn description(&self) -> &str {
        "Load a skill by name: its instructions (the body of its `SKILL.md`), with what rlm \
         resolved for it (its customization, persistent facts and workflow) and the list of \
         its other files. Load a skill when a task matches its description or a command names \
         it, then follow its instructions."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "The skill's name, as the list of skills gives it.",
                    "enum": self.session.skills().loadable_names(),
                }
            },
            "required": ["name"],
            "additionalProperties": false
        })
    }

    fn when_cut(&self) -> Option<&str> {
        Some(SKILL_CUT)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let name = args
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::InvalidArguments("`name` must be a string".to_owned()))?;
        activate(&self.session, name, self.name())
            .map(|activation| activation.to_json())
            .map_err(|e| ToolError::Failed(e.to_string()))
    }
}

/// `run_skill_script`: a Python script of a skill, run through the `python` tool.
pub(crate) struct RunSkillScript {
    session: Arc<BundleSession>,
    python: Option<Arc<dyn Tool>>,
}

impl std::fmt::Debug for RunSkillScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSkillScript")
            .field("python", &self.python.is_some())
            .finish_non_exhaustive()
    }
}

impl RunSkillScript {
    /// The tool over `session`'s skills, running scripts through `python` when given.
    pub(crate) fn new(session: Arc<BundleSession>, python: Option<Arc<dyn Tool>>) -> Self {
        Self { session, python }
    }

    /// The script `args` name, checked: a `.py` file under a skill's `scripts/` folder or
    /// the project's `_bmad/scripts/`, readable through the sandbox.
    fn script(&self, args: &Value) -> Result<std::path::PathBuf, ToolError> {
        let failed = |e: BundleError| ToolError::Failed(e.to_string());
        let session = &self.session;
        let written = args
            .get("script")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::InvalidArguments("`script` must be a string".to_owned()))?;
        let skill = match args.get("skill") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) => Some(
                session
                    .skills()
                    .get(name)
                    .ok_or_else(|| failed(no_skill(name, session.skills())))?,
            ),
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`skill` must be a skill's name".to_owned(),
                ));
            }
        };
        let path = session
            .variables()
            .resolve(written)
            .map_err(|e| failed(e.into()))?;
        let path = match skill {
            Some(skill) if !Path::new(&path).is_absolute() => {
                skill.dir.join(&path).display().to_string()
            }
            _ => session.skill_relative(&path),
        };
        let resolved = session
            .sandbox()
            .check_read(&path)
            .map_err(|e| failed(e.into()))?;
        let shared = session.roots().project.join("_bmad").join("scripts");
        let in_scripts = session
            .skills()
            .containing(&resolved)
            .is_some_and(|s| resolved.starts_with(s.dir.join("scripts")))
            || resolved.starts_with(&shared);
        if !in_scripts {
            return Err(ToolError::Failed(format!(
                "`{}` is not a skill script: only the files of a skill's `scripts/` folder and \
                 of `{}` run. The skills are: {}",
                resolved.display(),
                shared.display(),
                list_names(&session.skills().names())
            )));
        }
        if resolved.extension().is_none_or(|e| e != "py") {
            return Err(ToolError::Failed(format!(
                "`{}` is not a Python script; only Python scripts run here (through the \
                 `python` tool)",
                resolved.display()
            )));
        }
        if !session
            .sandbox()
            .is_readable_file(&resolved.display().to_string())
        {
            return Err(ToolError::Failed(format!(
                "`{}` does not exist or is not a file",
                resolved.display()
            )));
        }
        Ok(resolved)
    }
}

#[async_trait]
impl Tool for RunSkillScript {
    fn name(&self) -> &str {
        "run_skill_script"
    }

    fn description(&self) -> &str {
        "Run a Python script of a skill (a file of its `scripts/` folder, or one of BMAD's \
         shared `_bmad/scripts/`) with arguments, as its instructions say to (`uv run \
         SCRIPT ARGS` or `python3 SCRIPT ARGS` become `script` and `args`). Returns what it \
         printed. Scripts run only through the `python` tool: when the user did not allow \
         Python, the call fails."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "script": {"type": "string", "description": "The script: a path relative to the skill's folder (`scripts/check.py`) or with variables (`{project-root}/_bmad/scripts/memlog.py`)."},
                "args": {"type": "array", "items": {"type": "string"}, "description": "Its command-line arguments, one string each."},
                "skill": {"type": "string", "description": "The skill whose folder a relative `script` is in (default: the skill loaded last that has it)."}
            },
            "required": ["script"],
            "additionalProperties": false
        })
    }

    fn timeout(&self) -> Option<Duration> {
        self.python.as_ref().and_then(|p| p.timeout())
    }

    fn when_cut(&self) -> Option<&str> {
        self.python.as_ref().and_then(|p| p.when_cut())
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let script = self.script(&args)?;
        let arguments: Vec<String> = match args.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Ok(other.to_string()),
                })
                .collect::<Result<_, ToolError>>()?,
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`args` must be a list of strings".to_owned(),
                ));
            }
        };
        let Some(python) = &self.python else {
            return Err(ToolError::Failed(format!(
                "Cannot run `{}`: skill scripts run only through the `python` tool, and Python \
                 is off in this session (the user starts `rlm agent` with `--python` to allow \
                 it). Do what the script does by hand where the instructions allow it, or tell \
                 the user that it could not run.",
                script.display()
            )));
        };
        let (script, source) = self
            .session
            .sandbox()
            .read_text(&script.display().to_string(), self.name())
            .map_err(|e| ToolError::Failed(BundleError::from(e).to_string()))?;
        let code = script_code(&script, &source, &arguments);
        let mut result = python.call(json!({"code": code}), ctx).await?;
        if let Value::Object(map) = &mut result {
            map.insert("script".into(), json!(script));
        }
        Ok(result)
    }
}

/// Python code that runs `source`, the text of `script` as the sandbox read it, with `args`
/// as `__main__` (see the module docs). Its lines go into `linecache`, so that a traceback
/// shows the text that ran, not what the file holds by then.
fn script_code(script: &Path, source: &str, args: &[String]) -> String {
    // JSON strings are valid Python string literals.
    let text = |s: &str| Value::String(s.to_owned()).to_string();
    let folder = script.parent().unwrap_or(script).display().to_string();
    let args = args.iter().map(|a| text(a)).collect::<Vec<_>>().join(", ");
    format!(
        "def _rlm_run_script(path, source, args, folder):\n\
         \x20   import linecache, sys, types\n\
         \x20   main = types.ModuleType('__main__')\n\
         \x20   main.__file__ = path\n\
         \x20   linecache.cache[path] = (len(source), None, source.splitlines(True), path)\n\
         \x20   saved_argv, saved_path = sys.argv, list(sys.path)\n\
         \x20   saved_main = sys.modules.get('__main__')\n\
         \x20   sys.argv = [path, *args]\n\
         \x20   sys.path.insert(0, folder)\n\
         \x20   sys.modules['__main__'] = main\n\
         \x20   code = 0\n\
         \x20   try:\n\
         \x20       exec(compile(source, path, 'exec'), main.__dict__)\n\
         \x20   except SystemExit as stop:\n\
         \x20       if stop.code is None or isinstance(stop.code, int):\n\
         \x20           code = stop.code or 0\n\
         \x20       else:\n\
         \x20           print(stop.code, file=sys.stderr)\n\
         \x20           code = 1\n\
         \x20   finally:\n\
         \x20       sys.argv = saved_argv\n\
         \x20       sys.path[:] = saved_path\n\
         \x20       if saved_main is None:\n\
         \x20           sys.modules.pop('__main__', None)\n\
         \x20       else:\n\
         \x20           sys.modules['__main__'] = saved_main\n\
         \x20   if code:\n\
         \x20       print(f'[the script exited with code {{code}}]', file=sys.stderr)\n\
         _rlm_run_script({}, {}, [{args}], {})\n\
         del _rlm_run_script\n",
        text(&script.display().to_string()),
        text(source),
        text(&folder),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_code_quotes_its_path_source_and_arguments() {
        let code = script_code(
            Path::new("/s/x/scripts/a b.py"),
            "print(\"it's\")\n",
            &["--n".into(), "it's \"q\"".into()],
        );
        assert!(
            code.contains(
                r#"_rlm_run_script("/s/x/scripts/a b.py", "print(\"it's\")\n", ["--n", "it's \"q\""], "/s/x/scripts")"#
            ),
            "{code}"
        );
    }
}
