//! `rlm agent` with Agent Skills: the BMAD 6.12 tree (`shared/fixtures/bmad/v6.12-installed`,
//! copied into temporary projects) — John's menu from `customize.toml`, a team override, a menu
//! item running its workflow skill, start-up reading only what activation needs — and plain
//! skill folders the tests write (discovery, the catalog, `load_skill`, a reference file, a
//! script refused without `--python` and run with it), over both wire formats; and a workflow
//! file whose `persona:` names an agent skill of the project.

use serde_json::{Value, json};

use crate::agent::{Project, WIRES, Wire, agent_with_input, file_log, start_mock, triple};
use crate::flow::{args, read_events, run_flow};
use crate::support::{Mock, last_user_message};

const PM: &str = ".claude/skills/bmad-agent-pm";

/// The files start-up reads for the pm agent, besides the catalog (as (op, path, by)).
const PM_STARTUP: [(&str, &str); 6] = [
    ("[project]/.claude/skills/bmad-agent-pm/SKILL.md", "agent"),
    ("[project]/_bmad/bmm/config.yaml", "start-up"),
    ("[project]/_bmad/config.toml", "start-up"),
    ("[project]/_bmad/config.user.toml", "start-up"),
    ("[project]/_bmad/custom/config.toml", "start-up"),
    (
        "[project]/.claude/skills/bmad-agent-pm/customize.toml",
        "start-up",
    ),
];

/// The path the mock serves `wire` on.
fn wire_path(wire: Wire) -> &'static str {
    if wire.anthropic {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    }
}

/// The system prompt and the tool names of the first request `mock` got.
fn first_request(mock: &Mock, wire: Wire) -> (String, Vec<String>) {
    let entries = mock.log().entries();
    let request = entries.first().expect("a request");
    assert_eq!(
        (request.path.as_str(), request.stream),
        (wire_path(wire), wire.stream)
    );
    let body: Value = serde_json::from_str(request.body.as_deref().expect("body")).expect("json");
    let system = if wire.anthropic {
        body["system"].to_string()
    } else {
        body["messages"][0]["content"]
            .as_str()
            .expect("system")
            .to_owned()
    };
    let tools = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            t["name"]
                .as_str()
                .or_else(|| t["function"]["name"].as_str())
                .expect("a name")
                .to_owned()
        })
        .collect();
    (system, tools)
}

/// The reads of a `--file-log`, the catalog's (`by: skills`) counted apart.
fn split_catalog(log: Vec<(String, String, String)>) -> (Vec<(String, String, String)>, usize) {
    let catalog = log.iter().filter(|(_, _, by)| by == "skills").count();
    (
        log.into_iter()
            .filter(|(_, _, by)| by != "skills")
            .collect(),
        catalog,
    )
}

fn expected(pairs: &[(&str, &str)]) -> Vec<(String, String, String)> {
    pairs
        .iter()
        .map(|(path, by)| triple("read", path, by))
        .collect()
}

#[test]
fn the_pm_agent_shows_johns_menu_and_start_up_reads_only_what_activation_needs() {
    for wire in WIRES {
        let project = Project::copy("v6.12-installed");
        let mock = start_mock(json!({"models": {"root-model": {
            "rules": [{"turn": 0, "reply": "📋 Hello Dana, I am John."}],
            "fallback": "Unexpected."
        }}}));
        let log = project.root().join("files.jsonl");
        let run = agent_with_input(
            &mock,
            wire,
            &project,
            PM,
            &["--quiet", "--file-log", log.to_str().expect("utf-8")],
            Some(b"hi\n"),
        );
        run.assert_code(0);
        assert_eq!(
            run.stdout,
            "📋 John, Product Manager\n\n\
             1. *PRD: Create, update, or validate a PRD — state your intent or the skill will ask\n\
             2. *CE: Create the Epics and Stories Listing that will drive development\n\
             3. *IR: Check implementation readiness — verify the planning artifacts are complete and aligned (opens sprint planning; stop after the gate or continue into tracking)\n\
             4. *CC: Determine how to proceed if major need for change is discovered mid implementation\n\n\
             Pick a command by its number or `*name`, or just type a message.\n\n\
             📋 Hello Dana, I am John.\n",
            "{wire:?}"
        );

        // The skill, the config and the customization; the catalog is front matter only.
        let (reads, catalog) = split_catalog(file_log(&log, &project));
        assert_eq!(reads, expected(&PM_STARTUP), "{wire:?}");
        assert_eq!(catalog, 28, "{wire:?}");

        let (system, tools) = first_request(&mock, wire);
        assert!(
            system.contains("You are John, Product Manager."),
            "{wire:?}"
        );
        assert!(system.contains("- `bmad-build`: Turns implementation work into working code"));
        assert!(
            !system.contains("# Build New Preview Workflow"),
            "not loaded before it is needed"
        );
        assert_eq!(
            tools,
            ["read_file", "save_output", "load_skill", "run_skill_script"]
        );
    }
}

#[test]
fn a_team_override_changes_a_menu_item_and_a_principle() {
    for wire in [WIRES[0], WIRES[2]] {
        let project = Project::copy("v6.12-installed");
        std::fs::write(
            project.root().join("_bmad/custom/bmad-agent-pm.toml"),
            "[agent]\nprinciples = [\"Every PRD names its counter-metrics.\"]\n\n\
             [[agent.menu]]\ncode = \"CE\"\ndescription = \"Draft the epics with the delivery team's template\"\n\
             prompt = \"Read {project-root}/docs/epic-template.md, then draft the epics.\"\n",
        )
        .expect("team override");
        let mock = start_mock(json!({"models": {"root-model": {
            "rules": [
                {"last_user": "^Run command 2", "reply": "Drafting the epics."},
                {"turn": 0, "reply": "📋 Hello."}
            ],
            "fallback": "Unexpected."
        }}}));
        let log = project.root().join("files.jsonl");
        let run = agent_with_input(
            &mock,
            wire,
            &project,
            "bmad-agent-pm",
            &["--quiet", "--file-log", log.to_str().expect("utf-8")],
            Some(b"hi\n2\n"),
        );
        run.assert_code(0);
        assert!(
            run.stdout
                .contains("\n2. *CE: Draft the epics with the delivery team's template\n"),
            "{wire:?}: {}",
            run.stdout
        );
        assert!(
            run.stdout.ends_with("📋 Hello.\nDrafting the epics.\n"),
            "{}",
            run.stdout
        );

        let (system, _) = first_request(&mock, wire);
        let defaults = system
            .find("User value first; technical feasibility is a constraint.")
            .expect("the defaults stay");
        let added = system
            .find("Every PRD names its counter-metrics.")
            .expect("the team's principle");
        assert!(defaults < added, "appended after the defaults");
        let requests = mock.log().entries();
        let picked = last_user_message(&requests[1]);
        let root = project.root().display().to_string();
        assert!(
            picked.starts_with(
                "Run command 2, `*CE`: Draft the epics with the delivery team's template"
            ) && picked.contains(&format!(
                "`action`: `Read {root}/docs/epic-template.md, then draft the epics.`"
            )),
            "{picked}"
        );
        let (reads, _) = split_catalog(file_log(&log, &project));
        assert!(
            reads.contains(&triple(
                "read",
                "[project]/_bmad/custom/bmad-agent-pm.toml",
                "start-up"
            )),
            "{reads:?}"
        );
    }
}

#[test]
fn a_menu_item_runs_its_workflow_skill_and_the_model_gets_workflow_md() {
    for wire in WIRES {
        let project = Project::copy("v6.12-installed");
        std::fs::write(
            project.root().join("_bmad/custom/bmad-agent-pm.toml"),
            "[[agent.menu]]\ncode = \"BD\"\ndescription = \"Build the next story\"\nskill = \"bmad-build\"\n\n\
             [[agent.menu]]\ncode = \"QA\"\ndescription = \"Test it\"\nskill = \"bmad-qa-nope\"\n",
        )
        .expect("team override");
        let mock = start_mock(json!({"models": {"root-model": {
            "rules": [
                {"tool_name": "^read_file$", "last_tool": "Speak in `English`", "reply": "Step 1 is loaded."},
                {"tool_name": "^load_skill$", "last_tool": "# Build New Preview Workflow", "reply": {
                    "text": "Loading step 1.",
                    "tool_call": {"name": "read_file", "arguments": {"file_path": "step-01-clarify-and-route.md"}}
                }},
                {"last_user": "^Run command 5", "reply": {"tool_call": {"name": "load_skill", "arguments": {"name": "bmad-build"}}}}
            ],
            "fallback": "The workflow did not reach me."
        }}}));
        let log = project.root().join("files.jsonl");
        let run = agent_with_input(
            &mock,
            wire,
            &project,
            PM,
            &[
                "--message",
                "*BD",
                "--json",
                "--file-log",
                log.to_str().expect("utf-8"),
            ],
            None,
        );
        run.assert_code(0);
        assert!(
            run.stderr.contains(
                "warning: The menu item `QA` runs the skill `bmad-qa-nope`, which is not \
                 installed, so the model cannot load it"
            ),
            "{wire:?}: {}",
            run.stderr
        );
        let doc = run.json();
        let turn = &doc["turns"][0];
        assert_eq!(
            turn["answer"], "Step 1 is loaded.",
            "{wire:?}\n{}",
            run.stderr
        );
        assert!(
            turn["message"].as_str().expect("sent").starts_with(
                "Run command 5, `*BD`: Build the next story\nIts handlers:\n- `skill`: `bmad-build`"
            ),
            "{turn}"
        );
        for name in ["load_skill", "read_file"] {
            assert_eq!(
                turn["metrics"]["tools"][name]["calls"], 1,
                "{wire:?} {name}"
            );
            assert_eq!(
                turn["metrics"]["tools"][name]["failures"], 0,
                "{wire:?} {name}"
            );
        }
        assert_eq!(doc["agent"]["format"], "skill");

        // The model got workflow.md rendered (no placeholder left), then the step file.
        let requests = mock.log().entries();
        assert_eq!(requests.len(), 3, "{wire:?}");
        let second = requests[1].body.as_deref().expect("body");
        assert!(second.contains("# Build New Preview Workflow"), "{wire:?}");
        assert!(
            !second.contains("{workflow.activation_steps_prepend}"),
            "{wire:?}"
        );
        assert!(second.contains("Do not run `render_skill.py`"), "{wire:?}");
        let third = requests[2].body.as_deref().expect("body");
        let artifacts = format!(
            "{}/_bmad-output/implementation-artifacts",
            project.root().display()
        );
        assert!(
            third.contains(&artifacts),
            "{wire:?}: the step's values filled in"
        );

        let (reads, _) = split_catalog(file_log(&log, &project));
        let mut startup = PM_STARTUP.to_vec();
        startup.push(("[project]/_bmad/custom/bmad-agent-pm.toml", "start-up"));
        startup.extend([
            ("[project]/.claude/skills/bmad-build/SKILL.md", "load_skill"),
            (
                "[project]/.claude/skills/bmad-build/customize.toml",
                "load_skill",
            ),
            (
                "[project]/.claude/skills/bmad-build/workflow.md",
                "load_skill",
            ),
            (
                "[project]/.claude/skills/bmad-build/step-01-clarify-and-route.md",
                "read_file",
            ),
        ]);
        assert_eq!(reads, expected(&startup), "{wire:?}");
    }
}

/// A project with plain skills (not BMAD) the test writes: `helper` (the agent),
/// `meeting-notes` (a reference and a script) in `.agents/skills`, `tidy` in a folder given
/// with `--skills`.
struct SkillsProject {
    project: Project,
    _root: tempfile::TempDir,
    extra: tempfile::TempDir,
}

impl SkillsProject {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |rel: &str, text: &str| {
            let path = root.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        };
        write(
            ".claude/skills/helper/SKILL.md",
            "---\nname: helper\ndescription: A general helper. Use when nothing more specific fits.\n---\n# Helper\n\nHelp the user; load a skill when one fits.\n",
        );
        write(
            ".agents/skills/meeting-notes/SKILL.md",
            "---\nname: meeting-notes\ndescription: Turn a transcript into meeting notes. Use when the user shares a transcript.\nlicense: MIT\n---\n# Meeting notes\n\nWrite the notes as `references/format.md` says, then count their words with `scripts/count_words.py`.\n",
        );
        write(
            ".agents/skills/meeting-notes/references/format.md",
            "One line per decision, owners in brackets.",
        );
        write(
            ".agents/skills/meeting-notes/scripts/count_words.py",
            "import sys\n\nfrom words import count\n\nif __name__ == \"__main__\":\n    print(f\"{count(sys.argv[1:])} words\")\n",
        );
        write(
            ".agents/skills/meeting-notes/scripts/words.py",
            "def count(args):\n    return len(' '.join(args).split())\n",
        );
        write(
            ".agents/skills/broken/SKILL.md",
            "---\nname: broken\ndescription: Use when: the front matter is wrong\n---\nNever listed.\n",
        );
        let extra = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(extra.path().join("tidy")).expect("mkdir");
        std::fs::write(
            extra.path().join("tidy/SKILL.md"),
            "---\nname: tidy\ndescription: Tidy a document's headings. Use before publishing.\n---\nTidy it.\n",
        )
        .expect("write");
        Self {
            project: Project::at(root.path()),
            _root: root,
            extra,
        }
    }
}

fn notes_script() -> Value {
    json!({"models": {"root-model": {
        "rules": [
            {"tool_name": "^run_skill_script$", "last_tool": "Python is off", "reply": "The word count needs Python."},
            {"tool_name": "^run_skill_script$", "last_tool": "3 words", "reply": "The notes have 3 words."},
            {"tool_name": "^read_file$", "last_tool": "One line per decision", "reply": {"tool_call": {
                "name": "run_skill_script",
                "arguments": {"script": "scripts/count_words.py", "args": ["Ship on Friday"]}
            }}},
            {"tool_name": "^load_skill$", "last_tool": "# Meeting notes", "reply": {"tool_call": {
                "name": "read_file", "arguments": {"file_path": "references/format.md"}
            }}},
            {"turn": 0, "reply": {"tool_call": {"name": "load_skill", "arguments": {"name": "meeting-notes"}}}}
        ],
        "fallback": "Unexpected."
    }}})
}

#[test]
fn plain_skills_are_found_listed_loaded_and_their_scripts_refused_without_python() {
    for wire in [WIRES[0], WIRES[3]] {
        let skills = SkillsProject::new();
        let project = &skills.project;
        let mock = start_mock(notes_script());
        let log = project.root().join("files.jsonl");
        let extra = skills.extra.path().to_str().expect("utf-8").to_owned();
        let run = agent_with_input(
            &mock,
            wire,
            project,
            "helper",
            &[
                "--skills",
                &extra,
                "--message",
                "Here is the transcript: ship on Friday.",
                "--json",
                "--file-log",
                log.to_str().expect("utf-8"),
            ],
            None,
        );
        run.assert_code(0);
        let broken = project.root().join(".agents/skills/broken/SKILL.md");
        assert!(
            run.stderr.contains(&format!(
                "warning: Skipped a skill: `{}` line 3: The front matter is not valid YAML",
                broken.display()
            )),
            "{wire:?}: {}",
            run.stderr
        );
        let doc = run.json();
        let turn = &doc["turns"][0];
        assert_eq!(
            turn["answer"], "The word count needs Python.",
            "{wire:?}\n{}",
            run.stderr
        );
        assert_eq!(turn["metrics"]["tools"]["run_skill_script"]["failures"], 1);
        let names: Vec<&str> = doc["skills"]
            .as_array()
            .expect("skills")
            .iter()
            .map(|s| s["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["helper", "meeting-notes", "tidy"], "discovered");

        // The catalog lists names and descriptions only; load_skill brings the body.
        let (system, tools) = first_request(&mock, wire);
        assert!(system.contains("You are an assistant following the skill `helper`"));
        assert!(system.contains(
            "- `meeting-notes`: Turn a transcript into meeting notes. Use when the user shares a transcript."
        ));
        assert!(system.contains("- `tidy`: Tidy a document's headings. Use before publishing."));
        assert!(!system.contains("# Meeting notes"), "not loaded yet");
        assert_eq!(
            tools,
            ["read_file", "save_output", "load_skill", "run_skill_script"]
        );
        let requests = mock.log().entries();
        assert!(
            requests[1]
                .body
                .as_deref()
                .expect("body")
                .contains("# Meeting notes")
        );
        assert!(
            requests[2]
                .body
                .as_deref()
                .expect("body")
                .contains("One line per decision, owners in brackets.")
        );

        let (reads, catalog) = split_catalog(file_log(&log, project));
        assert_eq!(catalog, 3, "meeting-notes, tidy and the broken one");
        assert_eq!(
            reads,
            expected(&[
                ("[project]/.claude/skills/helper/SKILL.md", "agent"),
                (
                    "[project]/.agents/skills/meeting-notes/SKILL.md",
                    "load_skill"
                ),
                (
                    "[project]/.agents/skills/meeting-notes/references/format.md",
                    "read_file"
                ),
            ]),
            "{wire:?}"
        );
    }
}

#[test]
fn with_python_a_skill_script_runs_through_the_python_tool() {
    let skills = SkillsProject::new();
    let mock = start_mock(notes_script());
    let log = skills.project.root().join("files.jsonl");
    let run = agent_with_input(
        &mock,
        WIRES[2],
        &skills.project,
        ".claude/skills/helper",
        &[
            "--message",
            "Notes, please.",
            "--python",
            "--json",
            "--file-log",
            log.to_str().expect("utf-8"),
        ],
        None,
    );
    run.assert_code(0);
    let doc = run.json();
    assert_eq!(
        doc["turns"][0]["answer"], "The notes have 3 words.",
        "{}",
        run.stderr
    );
    let result = mock.log().entries()[3].body.clone().unwrap_or_default();
    assert!(result.contains("3 words"), "the script's output went back");
    // The script ran as the sandbox read it; its sibling module is Python's own import.
    let (reads, _) = split_catalog(file_log(&log, &skills.project));
    assert_eq!(
        reads.last(),
        Some(&triple(
            "read",
            "[project]/.agents/skills/meeting-notes/scripts/count_words.py",
            "run_skill_script"
        ))
    );
}

#[test]
fn a_folder_that_is_not_an_agent_says_what_it_is() {
    let project = Project::copy("v6.12-installed");
    let mock = start_mock(json!({"models": {"root-model": {"replies": ["never"]}}}));
    for (path, found) in [
        (
            ".claude/skills",
            "is a folder of 29 skills; pass one of them",
        ),
        (".", "is a project folder; name one of its agents or skills"),
        (
            "bmad-agent-nobody",
            "is neither a file nor the name of a skill of the project",
        ),
    ] {
        let run = agent_with_input(&mock, WIRES[0], &project, path, &["--message", "hi"], None);
        run.assert_code(1);
        assert!(run.stderr.contains(found), "{path}: {}", run.stderr);
    }
    assert!(mock.log().entries().is_empty(), "no model call");
}

#[test]
fn a_workflow_file_names_an_agent_skill_of_the_project_as_its_persona() {
    for provider in ["openai", "anthropic"] {
        let project = Project::copy("v6.12-installed");
        let dir = tempfile::tempdir().expect("tempdir");
        let workflow = dir.path().join("review.yaml");
        std::fs::write(
            &workflow,
            "name: reviewer\ndescription: Reviews the goal as the product manager.\n\
             persona: bmad-agent-pm\ninstruction: |\n  Review the goal: {goal?}\n\
             output_key: review\ntools:\n  - name: load_skill\n",
        )
        .expect("workflow");
        let mock = Mock::start(json!({"models": {"flow-model": {
            "rules": [
                {"tool_name": "^load_skill$", "last_tool": "# BMad PRD", "reply": "John: the PRD skill is loaded."},
                {"system": "(?s)^You are John, Product Manager, one agent of a workflow\\..*Review the goal: Grow sales",
                 "reply": {"tool_call": {"name": "load_skill", "arguments": {"name": "bmad-prd"}}}}
            ],
            "fallback": "The persona did not reach me."
        }}}));
        let root = project.root().display().to_string();
        let run = run_flow(
            &mock,
            provider,
            dir.path(),
            &args(&[
                workflow.to_str().expect("utf-8"),
                "--input",
                "goal=Grow sales",
                "--bundle",
                &root,
            ]),
        );
        run.assert_code(0);
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("state.json")).expect("state"),
        )
        .expect("JSON");
        assert_eq!(
            state["review"], "John: the PRD skill is loaded.",
            "{provider}: {}",
            run.stderr
        );
        let loaded = read_events(&dir.path().join("events.jsonl"))
            .iter()
            .flat_map(|e| e["tool_results"].as_array().cloned().unwrap_or_default())
            .find(|r| r["name"] == "load_skill")
            .expect("load_skill ran");
        assert_eq!(loaded["result"]["skill"], "bmad-prd", "{provider}");
    }
}
