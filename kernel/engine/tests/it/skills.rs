//! Agent Skills and BMAD 6.12 (`shared/fixtures/bmad/v6.12-installed`, copied into temporary
//! projects): an agent skill started from its merged customization, team and user overrides,
//! `load_skill` on a workflow BMAD renders, a skill played directly, the skills of a 6.0 agent,
//! personas from skills, and what cannot be played.

use engine::bundle::{
    AgentFormat, BundleError, HandlerKind, PersonaBundle, SkillNote, StartOptions, StartedAgent,
};
use serde_json::{Value, json};

use crate::bundle_support::{Project, ctx, pairs, tool};

const PM: &str = ".claude/skills/bmad-agent-pm";

/// The 6.12 tree, copied.
fn project() -> Project {
    Project::copy("v6.12-installed")
}

/// The reads of the file log as (path, by), paths redacted, without the catalog's.
fn reads(agent: &StartedAgent, project: &Project) -> Vec<(String, String)> {
    let mut all = crate::bundle_support::reads(agent, project);
    all.retain(|(_, by)| by != "skills");
    all
}

async fn call(agent: &StartedAgent, name: &str, args: Value) -> Result<Value, String> {
    tool(agent, name)
        .call(args, &ctx())
        .await
        .map_err(|e| e.to_string())
}

#[test]
fn a_bmad_agent_skill_starts_from_its_customization_reading_only_what_activation_needs() {
    let project = project();
    let agent = project.start(PM);
    let definition = &agent.definition;
    assert_eq!(definition.format, AgentFormat::Skill);
    assert_eq!(
        (definition.name.as_str(), definition.title.as_str()),
        ("John", "Product Manager")
    );
    assert_eq!(definition.icon.as_deref(), Some("📋"));
    assert!(
        definition
            .persona
            .identity
            .starts_with("Thinks like Marty Cagan")
    );
    assert_eq!(definition.persona.principles.lines().count(), 3);
    let menu: Vec<(&str, Option<&str>)> = definition
        .commands
        .iter()
        .map(|c| (c.trigger.as_str(), c.handler(HandlerKind::Skill)))
        .collect();
    assert_eq!(
        menu,
        [
            ("PRD", Some("bmad-prd")),
            ("CE", Some("bmad-create-epics-and-stories")),
            ("IR", Some("bmad-sprint-planning")),
            ("CC", Some("bmad-correct-course")),
        ]
    );
    insta::assert_snapshot!(agent.menu(), @r"
    📋 John, Product Manager

    1. *PRD: Create, update, or validate a PRD — state your intent or the skill will ask
    2. *CE: Create the Epics and Stories Listing that will drive development
    3. *IR: Check implementation readiness — verify the planning artifacts are complete and aligned (opens sprint planning; stop after the gate or continue into tracking)
    4. *CC: Determine how to proceed if major need for change is discovered mid implementation

    Pick a command by its number or `*name`, or just type a message.
    ");

    // Start-up read the skill, the config and the customization; the catalog read the
    // front matter of every other skill, and nothing else was opened.
    assert_eq!(
        reads(&agent, &project),
        pairs(&[
            ("[project]/.claude/skills/bmad-agent-pm/SKILL.md", "agent"),
            ("[project]/_bmad/bmm/config.yaml", "start-up"),
            ("[project]/_bmad/config.toml", "start-up"),
            ("[project]/_bmad/config.user.toml", "start-up"),
            ("[project]/_bmad/custom/config.toml", "start-up"),
            (
                "[project]/.claude/skills/bmad-agent-pm/customize.toml",
                "start-up"
            ),
        ])
    );
    let catalog: Vec<String> = agent
        .session
        .file_log()
        .entries()
        .into_iter()
        .filter(|a| a.by == "skills")
        .map(|a| project.redact(&a.path.display().to_string()))
        .collect();
    assert_eq!(catalog.len(), 28, "{catalog:?}");
    assert!(
        catalog
            .iter()
            .all(|p| p.starts_with("[project]/.claude/skills/bmad-") && p.ends_with("/SKILL.md"))
    );
    assert_eq!(agent.session.skills().len(), 29);

    // The model is told what was resolved, and the catalog lists names and descriptions.
    let system = &agent.system_prompt;
    assert!(
        system.starts_with("You are John, Product Manager."),
        "{system}"
    );
    assert!(system.contains("  - Ship the smallest thing that validates the assumption."));
    assert!(
        system.contains("## On Activation"),
        "the SKILL.md's own instructions"
    );
    assert!(system.contains("- `bmad-prd`: Create, update, or validate a PRD."));
    assert!(!system.contains("{skill-root}"), "filled in");
    let startup = &agent.startup_message;
    assert!(startup.contains("do not run them again"), "{startup}");
    assert!(startup.contains("\"skill\": \"bmad-create-epics-and-stories\""));
    assert!(startup.contains("- `{user_name}`: Dana"), "{startup}");
    assert!(
        startup.contains(
            "- `{planning_artifacts}`: [project]/_bmad-output/planning-artifacts"
                .replace("[project]", &project.root().display().to_string())
                .as_str()
        )
    );
    assert_eq!(
        agent.session.sandbox().write_root(),
        project.root().join("_bmad-output")
    );
    let tools: Vec<String> = agent.tools().iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(
        tools,
        ["read_file", "save_output", "load_skill", "run_skill_script"]
    );
}

#[test]
fn team_and_user_overrides_merge_by_bmad_rules_and_load_persistent_facts() {
    let project = project();
    std::fs::write(
        project.path("_bmad/custom/bmad-agent-pm.toml"),
        r#"[agent]
name = "Bob"
icon = "🏥"
principles = ["Ship nothing that can't pass an FDA audit."]
persistent_facts = ["Our org is AWS-only.", "file:{project-root}/docs/**/*.md"]
activation_steps_prepend = ["Scan {project-root}/docs/compliance/ first."]

[[agent.menu]]
code = "CE"
description = "Create Epics using our delivery framework"
skill = "bmad-spec"

[[agent.menu]]
code = "RC"
description = "Run compliance pre-check"
prompt = "Read {project-root}/docs/compliance/checklist.md and check {planning_artifacts}."
"#,
    )
    .expect("team override");
    std::fs::write(
        project.path("_bmad/custom/bmad-agent-pm.user.toml"),
        "[agent]\nprinciples = [\"Bullets over prose.\"]\n",
    )
    .expect("user override");
    std::fs::create_dir_all(project.path("docs/compliance")).expect("mkdir");
    std::fs::write(
        project.path("docs/compliance/hipaa.md"),
        "PHI never leaves the VPC.",
    )
    .expect("fact file");

    let agent = project.start(PM);
    let definition = &agent.definition;
    assert_eq!(definition.name, "John", "the identity is the skill's own");
    assert_eq!(definition.icon.as_deref(), Some("🏥"));
    assert_eq!(
        definition.persona.principles.lines().collect::<Vec<_>>(),
        [
            "PRDs emerge from user interviews, not template filling.",
            "Ship the smallest thing that validates the assumption.",
            "User value first; technical feasibility is a constraint.",
            "Ship nothing that can't pass an FDA audit.",
            "Bullets over prose.",
        ]
    );
    let menu: Vec<(&str, &str)> = definition
        .commands
        .iter()
        .map(|c| (c.trigger.as_str(), c.description.as_str()))
        .collect();
    assert_eq!(
        menu,
        [
            (
                "PRD",
                "Create, update, or validate a PRD — state your intent or the skill will ask"
            ),
            ("CE", "Create Epics using our delivery framework"),
            (
                "IR",
                "Check implementation readiness — verify the planning artifacts are complete and aligned (opens sprint planning; stop after the gate or continue into tracking)"
            ),
            (
                "CC",
                "Determine how to proceed if major need for change is discovered mid implementation"
            ),
            ("RC", "Run compliance pre-check"),
        ]
    );
    assert_eq!(
        definition.commands[1].handler(HandlerKind::Skill),
        Some("bmad-spec")
    );
    let rc = agent.command_message("*RC").expect("a command");
    assert_eq!(
        agent.command_message("rc").as_ref(),
        Some(&rc),
        "a bare code picks it too"
    );
    assert!(agent.command_message("hello").is_none());
    let root = project.root().display().to_string();
    assert!(
        rc.contains(&format!(
            "Read {root}/docs/compliance/checklist.md and check {root}/_bmad-output/planning-artifacts."
        )),
        "{rc}"
    );

    // The overrides and the fact file were read at start-up, and the facts reach the model.
    let read = reads(&agent, &project);
    for (path, by) in [
        ("[project]/_bmad/custom/bmad-agent-pm.toml", "start-up"),
        ("[project]/_bmad/custom/bmad-agent-pm.user.toml", "start-up"),
        ("[project]/docs/compliance/hipaa.md", "start-up"),
    ] {
        assert!(read.contains(&(path.to_owned(), by.to_owned())), "{read:?}");
    }
    let startup = &agent.startup_message;
    assert!(startup.contains("- Our org is AWS-only."), "{startup}");
    assert!(startup.contains("PHI never leaves the VPC."), "{startup}");
    assert!(
        startup.contains(&format!("1. Scan {root}/docs/compliance/ first.")),
        "{startup}"
    );
    assert!(
        agent.system_prompt.contains("  - Bullets over prose."),
        "{}",
        agent.system_prompt
    );
}

#[test]
fn a_bad_override_is_an_error_naming_the_file_and_line() {
    let project = project();
    std::fs::write(
        project.path("_bmad/custom/bmad-agent-pm.toml"),
        "[agent]\nicon = \"🏥\"\nprinciples = [\n",
    )
    .expect("write");
    let err = StartedAgent::start(&project.path(PM), &project.options()).expect_err("refused");
    let text = project.redact(&err.to_string());
    assert!(
        text.starts_with("`[project]/_bmad/custom/bmad-agent-pm.toml` line "),
        "{text}"
    );
    assert!(text.contains("This is not valid TOML"), "{text}");

    std::fs::write(
        project.path("_bmad/custom/bmad-agent-pm.toml"),
        "[[agent.menu]]\ncode = \"XX\"\ndescription = \"Both\"\nskill = \"a\"\nprompt = \"b\"\n",
    )
    .expect("write");
    let err = StartedAgent::start(&project.path(PM), &project.options()).expect_err("refused");
    assert!(
        err.to_string().ends_with(
            "cannot be used: the menu item `XX` has both `skill` and `prompt`; give it one of them"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn load_skill_renders_a_bmad_workflow_and_read_file_its_step_files() {
    let project = project();
    let agent = project.start(PM);
    let root = project.root().display().to_string();
    let loaded = call(&agent, "load_skill", json!({"name": "bmad-build"}))
        .await
        .expect("loads");
    let workflow = loaded["workflow"]["content"].as_str().expect("workflow.md");
    assert!(
        workflow.starts_with("# Build New Preview Workflow"),
        "{workflow}"
    );
    assert!(!workflow.contains("{workflow."), "customization filled in");
    assert!(workflow.contains(
        "Execute each of these steps in order before proceeding (`_None._` means skip):\n\n_None._"
    ));
    assert!(
        workflow.contains(&format!(
            "{root}/.claude/skills/bmad-build/step-01-clarify-and-route.md"
        )),
        "snapshot paths point into the skill"
    );
    let note = loaded["note"].as_str().expect("note");
    assert!(note.contains("Do not run `render_skill.py`"), "{note}");
    assert!(loaded["customization"]["values"]["workflow"]["review_layers"].is_array());
    assert!(
        loaded["resources"]
            .as_array()
            .expect("listed")
            .contains(&json!("references/claims-check.md"))
    );

    // A bare relative path is the loaded skill's file, its values filled in as it is read.
    let step = call(
        &agent,
        "read_file",
        json!({"file_path": "step-01-clarify-and-route.md"}),
    )
    .await
    .expect("reads");
    assert_eq!(
        step["path"],
        json!(format!(
            "{root}/.claude/skills/bmad-build/step-01-clarify-and-route.md"
        ))
    );
    let content = step["content"].as_str().expect("text");
    assert!(!content.contains("{{."), "{content}");
    assert!(content.contains(&format!("{root}/_bmad-output/implementation-artifacts")));
    assert!(content.contains("Speak in `English`"), "{content}");

    // A later skill's folder comes first; a file only the earlier one has still resolves.
    call(&agent, "load_skill", json!({"name": "bmad-prd"}))
        .await
        .expect("loads");
    let reference = call(
        &agent,
        "read_file",
        json!({"file_path": "references/validate.md"}),
    )
    .await
    .expect("reads");
    assert_eq!(
        reference["path"],
        json!(format!(
            "{root}/.claude/skills/bmad-prd/references/validate.md"
        ))
    );
    let claims = call(
        &agent,
        "read_file",
        json!({"file_path": "references/claims-check.md"}),
    )
    .await
    .expect("reads");
    assert_eq!(
        claims["path"],
        json!(format!(
            "{root}/.claude/skills/bmad-build/references/claims-check.md"
        ))
    );

    // Loading read the skill's files as it went; nothing else.
    let read: Vec<(String, String)> = reads(&agent, &project).split_off(6);
    assert_eq!(
        read,
        pairs(&[
            ("[project]/.claude/skills/bmad-build/SKILL.md", "load_skill"),
            (
                "[project]/.claude/skills/bmad-build/customize.toml",
                "load_skill"
            ),
            (
                "[project]/.claude/skills/bmad-build/workflow.md",
                "load_skill"
            ),
            (
                "[project]/.claude/skills/bmad-build/step-01-clarify-and-route.md",
                "read_file"
            ),
            ("[project]/.claude/skills/bmad-prd/SKILL.md", "load_skill"),
            (
                "[project]/.claude/skills/bmad-prd/customize.toml",
                "load_skill"
            ),
            (
                "[project]/.claude/skills/bmad-prd/references/validate.md",
                "read_file"
            ),
            (
                "[project]/.claude/skills/bmad-build/references/claims-check.md",
                "read_file"
            ),
        ])
    );

    let err = call(&agent, "load_skill", json!({"name": "nope"}))
        .await
        .expect_err("no such skill");
    assert!(
        err.starts_with("There is no skill `nope`; the skills are: `bmad-advanced-elicitation`"),
        "{err}"
    );
}

#[tokio::test]
async fn scripts_are_refused_without_python_and_outside_a_skills_scripts() {
    let project = project();
    let agent = project.start(PM);
    call(
        &agent,
        "load_skill",
        json!({"name": "bmad-advanced-elicitation"}),
    )
    .await
    .expect("loads");
    let err = call(
        &agent,
        "run_skill_script",
        json!({"script": "scripts/pick_methods.py", "args": ["--count", "3"]}),
    )
    .await
    .expect_err("no python");
    assert!(
        err.contains("skill scripts run only through the `python` tool, and Python is off"),
        "{err}"
    );
    for (script, problem) in [
        ("assets/methods.csv", "is not a skill script"),
        (
            "{project-root}/_bmad/bmm/config.yaml",
            "is not a skill script",
        ),
        ("{project-root}/../../etc/passwd", "is outside the folders"),
        (
            "{project-root}/_bmad/scripts/config_utils.py",
            "Python is off",
        ),
    ] {
        let err = call(&agent, "run_skill_script", json!({"script": script}))
            .await
            .expect_err(script);
        assert!(err.contains(problem), "{script}: {err}");
    }
}

#[test]
fn a_menu_item_running_a_skill_that_is_not_installed_is_a_warning() {
    let project = project();
    assert_eq!(
        project.start(PM).warnings(),
        Vec::<String>::new(),
        "every skill of John's menu is installed"
    );
    std::fs::write(
        project.path("_bmad/custom/bmad-agent-pm.toml"),
        "[[agent.menu]]\ncode = \"BD\"\ndescription = \"Build\"\nskill = \"bmad-bild\"\n",
    )
    .expect("team override");
    let warnings = project.start(PM).warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(
            "The menu item `BD` runs the skill `bmad-bild`, which is not installed, so the \
             model cannot load it: correct its `skill`"
        ) && warnings[0].contains("`bmad-build`"),
        "{}",
        warnings[0]
    );
}

/// A `python` tool that keeps the code it is given and runs none of it.
#[derive(Default)]
struct RecordingPython {
    code: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl engine::Tool for RecordingPython {
    fn name(&self) -> &str {
        "python"
    }

    fn description(&self) -> &str {
        "Records code."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }

    async fn call(
        &self,
        args: Value,
        _ctx: &engine::ToolContext,
    ) -> Result<Value, engine::ToolError> {
        let code = args["code"].as_str().unwrap_or_default().to_owned();
        self.code.lock().expect("lock").push(code);
        Ok(json!({"stdout": "ran"}))
    }
}

#[tokio::test]
async fn a_script_runs_as_the_sandbox_read_it_and_a_hard_link_out_never_runs() {
    let project = project();
    let agent = project.start(PM);
    let python = std::sync::Arc::new(RecordingPython::default());
    let run = agent
        .tools_with_python(Some(python.clone()))
        .into_iter()
        .find(|t| t.name() == "run_skill_script")
        .expect("the tool");
    let scripts = project.path(".claude/skills/bmad-advanced-elicitation/scripts");

    // What runs is the text the sandbox read (and logged), not a path Python opens.
    let result = run
        .call(
            json!({"script": "scripts/pick_methods.py", "skill": "bmad-advanced-elicitation", "args": ["categories"]}),
            &ctx(),
        )
        .await
        .expect("runs");
    assert_eq!(result["stdout"], "ran");
    let source = std::fs::read_to_string(scripts.join("pick_methods.py")).expect("script");
    let sent = python.code.lock().expect("lock").clone();
    assert_eq!(sent.len(), 1);
    let literal = serde_json::to_string(&source).expect("json");
    assert!(
        sent[0].contains(&literal),
        "the script's text is in the code"
    );
    assert!(!sent[0].contains("run_path"), "Python opens no path itself");
    assert_eq!(
        reads(&agent, &project).last(),
        Some(&(
            "[project]/.claude/skills/bmad-advanced-elicitation/scripts/pick_methods.py".to_owned(),
            "run_skill_script".to_owned()
        ))
    );

    // A skill's script hard-linked to a file outside every root is not read, so not run:
    // its lines would come back in a traceback.
    let outside = tempfile::tempdir().expect("tempdir");
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "API_KEY = 'sk-outside-the-roots'\n").expect("secret");
    std::fs::hard_link(&secret, scripts.join("leak.py")).expect("hard link");
    let err = run
        .call(
            json!({"script": "scripts/leak.py", "skill": "bmad-advanced-elicitation"}),
            &ctx(),
        )
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("has 2 hard links"), "{err}");
    assert!(!err.contains("sk-outside"), "{err}");
    assert_eq!(
        python.code.lock().expect("lock").len(),
        1,
        "nothing more ran"
    );
}

#[test]
fn a_workflow_skill_is_played_directly_with_its_customization() {
    let project = project();
    let agent = project.start(".claude/skills/bmad-prd");
    assert_eq!(agent.definition.format, AgentFormat::Skill);
    assert!(agent.definition.commands.is_empty());
    assert_eq!(agent.menu(), "bmad-prd\n\nType a message to start.");
    assert!(
        agent
            .system_prompt
            .starts_with("You are an assistant following the skill `bmad-prd`: Create, update"),
        "{}",
        agent.system_prompt
    );
    assert!(agent.system_prompt.contains("# BMad PRD"));
    let startup = &agent.startup_message;
    assert!(
        startup.contains("\"prd_template\": \"assets/prd-template.md\""),
        "{startup}"
    );
    assert!(
        startup.contains("`assets/prd-template.md`"),
        "resources listed"
    );
}

#[tokio::test]
async fn a_6_0_agent_gets_the_skills_of_its_project_and_of_skill_folders() {
    let project = Project::copy("v6-installed");
    let write = |rel: &str, text: &str| {
        let path = project.path(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write(
        ".agents/skills/notes/SKILL.md",
        "---\nname: notes\ndescription: Take meeting notes. Use when the user shares a transcript.\n---\n# Notes\n\nFollow `references/format.md`.\n",
    );
    write(
        ".agents/skills/notes/references/format.md",
        "One line per decision.",
    );
    write(
        ".agents/skills/broken/SKILL.md",
        "---\nname: broken\ndescription: Use when: anything\n---\n",
    );
    write(
        ".claude/skills/notes/SKILL.md",
        "---\nname: notes\ndescription: Shadowed.\n---\n",
    );
    let extra = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(extra.path().join("tidy")).expect("mkdir");
    std::fs::write(
        extra.path().join("tidy/SKILL.md"),
        "---\nname: tidy\ndescription: Tidy a document.\n---\nTidy it.\n",
    )
    .expect("write");
    let options = StartOptions {
        skill_folders: vec![extra.path().to_owned()],
        ..project.options()
    };
    let agent =
        StartedAgent::start(&project.path("_bmad/bmm/agents/sm.md"), &options).expect("starts");
    assert_eq!(agent.definition.format, AgentFormat::AgentXml);
    assert_eq!(agent.session.skills().names(), ["notes", "tidy"]);
    let notes: Vec<String> = agent
        .session
        .skills()
        .notes()
        .iter()
        .map(|n| project.redact(&n.to_string()))
        .collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("Skipped a skill: `[project]/.agents/skills/broken/SKILL.md` line 3: The front matter is not valid YAML"),
        "{notes:?}"
    );
    assert!(matches!(
        agent.session.skills().notes()[1],
        SkillNote::Shadowed { .. }
    ));
    assert!(
        agent
            .system_prompt
            .contains("- `notes`: Take meeting notes. Use when the user shares a transcript.")
    );
    let tools: Vec<String> = agent.tools().iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(
        tools,
        [
            "read_file",
            "execute_workflow",
            "save_output",
            "load_skill",
            "run_skill_script"
        ]
    );
    let loaded = call(&agent, "load_skill", json!({"name": "notes"}))
        .await
        .expect("loads");
    assert_eq!(
        loaded["instructions"],
        "# Notes\n\nFollow `references/format.md`."
    );
    let read = call(
        &agent,
        "read_file",
        json!({"file_path": "references/format.md"}),
    )
    .await
    .expect("reads");
    assert_eq!(read["content"], "One line per decision.");
    let tidy = call(&agent, "load_skill", json!({"name": "tidy"}))
        .await
        .expect("loads");
    assert_eq!(tidy["instructions"], "Tidy it.");

    // The malformed skill is not listed, but asking for it by name says what is wrong.
    let load = tool(&agent, "load_skill");
    assert_eq!(
        load.parameters()["properties"]["name"]["enum"],
        json!(["broken", "notes", "tidy"])
    );
    let err = call(&agent, "load_skill", json!({"name": "broken"}))
        .await
        .expect_err("malformed");
    assert!(
        project.redact(&err).starts_with(
            "`[project]/.agents/skills/broken/SKILL.md` line 3: The front matter is not valid YAML"
        ),
        "{err}"
    );
    assert!(!agent.system_prompt.contains("`broken`"));

    // A skill that changed since the catalog was made is checked again when loaded.
    write(
        ".agents/skills/notes/SKILL.md",
        "---\nname: Notes\ndescription: d\n---\n",
    );
    let err = call(&agent, "load_skill", json!({"name": "notes"}))
        .await
        .expect_err("malformed now");
    assert!(
        project.redact(&err).starts_with("`[project]/.agents/skills/notes/SKILL.md` line 2: The skill name `Notes` is not allowed"),
        "{err}"
    );
}

#[test]
fn a_skill_linked_from_outside_the_project_is_not_read() {
    let project = project();
    let outside = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(outside.path().join("evil")).expect("mkdir");
    std::fs::write(
        outside.path().join("evil/SKILL.md"),
        "---\nname: evil\ndescription: Reads your keys.\n---\n",
    )
    .expect("write");
    std::os::unix::fs::symlink(
        outside.path().join("evil"),
        project.path(".claude/skills/evil"),
    )
    .expect("link");
    let agent = project.start(PM);
    assert!(agent.session.skills().get("evil").is_none());
    let note = agent
        .session
        .skills()
        .notes()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        note.contains("is outside the folders this agent may read"),
        "{note}"
    );
}

#[test]
fn what_cannot_be_played_says_what_it_is() {
    let project = project();
    let v6 = Project::copy("v6-installed");
    let options = StartOptions {
        working_dir: Some(project.root()),
        ..project.options()
    };
    let start = |path: std::path::PathBuf| {
        StartedAgent::start(&path, &options)
            .map(|_| ())
            .expect_err("refused")
    };
    let cases = [
        (
            project.root(),
            "is a project folder; name one of its agents or skills",
        ),
        (
            project.path(".claude/skills"),
            "is a folder of 29 skills; pass one of them",
        ),
        (
            project.path("_bmad/scripts/render_skill.py"),
            "is a `.py` file; pass a skill folder",
        ),
        (project.path("_bmad"), "is a folder without a `SKILL.md`"),
        (
            v6.path("_bmad/bmm"),
            "is an agent bundle folder (BMAD 6.0); pass one of its agent files: `agents/sm.md`",
        ),
        (
            v6.path("_bmad/bmm/workflows/4-implementation/sprint-planning/workflow.yaml"),
            "is a BMAD 6.0 workflow; start the agent whose menu runs it",
        ),
        (
            "bmad-agent-nobody".into(),
            "is neither a file nor the name of a skill of the project; the skills are: `bmad-advanced-elicitation`",
        ),
    ];
    for (path, expected) in cases {
        let err = start(path.clone());
        assert!(
            matches!(err, BundleError::Unsupported { .. }),
            "{}: {err:?}",
            path.display()
        );
        assert!(
            err.to_string().contains(expected),
            "{}: {err}",
            path.display()
        );
    }
    let source =
        crate::bundle_support::fixtures().join("sources/v6.0.4/src/bmm/agents/sm.agent.yaml");
    let err = start(source);
    assert!(
        err.to_string()
            .contains("is a BMAD agent source (`*.agent.yaml`), which BMAD's installer compiles"),
        "{err}"
    );
    std::fs::write(
        project.path("notes.md"),
        "---\nname: notes\ndescription: A skill under the wrong name.\n---\nHi\n",
    )
    .expect("write");
    let err = start(project.path("notes.md"));
    assert!(
        err.to_string()
            .contains("is a markdown file with skill front matter"),
        "{err}"
    );

    // BMAD v4 (YAML in markdown under `.bmad-core/`) is named as such, not as a malformed
    // agent file or a 6.0 bundle.
    let v4 = tempfile::tempdir().expect("tempdir");
    let core = v4.path().join(".bmad-core");
    std::fs::create_dir_all(core.join("agents")).expect("mkdir");
    std::fs::write(
        core.join("core-config.yaml"),
        "devStoryLocation: docs/stories\n",
    )
    .expect("write");
    std::fs::write(
        core.join("agents/pm.md"),
        "# pm\n\nACTIVATION-NOTICE: This file contains your full agent operating guidelines.\n\n\
         ```yaml\nactivation-instructions:\n  - STEP 1: Read THIS ENTIRE FILE\nagent:\n  \
         name: John\n  id: pm\npersona:\n  role: Product Strategist\ncommands:\n  - help\n```\n",
    )
    .expect("write");
    for (path, found) in [
        (
            core.join("agents/pm.md"),
            "is a BMAD v4 agent (a YAML block in markdown",
        ),
        (core.clone(), "is a BMAD v4 install (`.bmad-core`)"),
        (v4.path().to_owned(), "is a BMAD v4 install (`.bmad-core`)"),
    ] {
        let err = start(path.clone());
        assert!(matches!(err, BundleError::Unsupported { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(found) && text.contains("install BMAD 6 in the project"),
            "{}: {text}",
            path.display()
        );
    }

    // By name, from the working directory; its `SKILL.md` and `customize.toml` name it too.
    for path in [
        "bmad-agent-pm".into(),
        project.path(PM).join("SKILL.md"),
        project.path(PM).join("customize.toml"),
    ] {
        let agent = StartedAgent::start(&path, &options).expect("starts");
        assert_eq!(agent.definition.name, "John");
    }
}

#[test]
fn a_workflow_persona_plays_an_agent_skill() {
    let project = project();
    for (bundle, persona) in [
        (project.root(), "bmad-agent-pm"),
        (project.path(".claude/skills"), "bmad-agent-pm"),
        (project.path(PM), "planner"),
    ] {
        let personas = PersonaBundle::new(bundle.clone(), project.options());
        let agent = personas.start(persona).expect("starts");
        let preamble = agent.preamble();
        assert!(
            preamble.starts_with("You are John, Product Manager, one agent of a workflow."),
            "{preamble}"
        );
        assert!(
            preamble.contains("- `*PRD`: Create, update, or validate a PRD — state your intent or the skill will ask (runs the skill `bmad-prd`)"),
            "{preamble}"
        );
        assert!(preamble.contains("- `{user_name}`: Dana"), "{preamble}");
        assert!(agent.tool("load_skill").is_some());
    }
    let personas = PersonaBundle::new(project.path(".claude/skills"), project.options());
    let err = personas.start("planner").map(|_| ()).expect_err("none");
    assert!(
        err.to_string().contains("has no agent `planner`")
            && err.to_string().contains("`bmad-agent-pm`"),
        "{err}"
    );
}
