//! Both fixture bundles: parsing, start-up, prompts, and the file tools.

use engine::bundle::{BundleError, FileOp, HandlerKind, StartOptions, StartedAgent};
use serde_json::{Value, json};

use crate::bundle_support::{DATE, Project, ctx, pairs, reads, tool};

const ALPHA: &str = "bmad/cis/agents/design-thinking-coach.md";
const COMPILED: &str = "_bmad/bmm/agents/sm.md";
const DESIGN: &str = "{project-root}/bmad/cis/workflows/design-thinking/workflow.yaml";
const SPRINT: &str =
    "{project-root}/_bmad/bmm/workflows/4-implementation/sprint-planning/workflow.yaml";
const STORY: &str =
    "{project-root}/_bmad/bmm/workflows/4-implementation/create-story/workflow.yaml";

#[test]
fn the_hand_written_form_parses() {
    let project = Project::copy("v6-alpha0");
    let agent = project.start(ALPHA).definition;
    assert_eq!(
        (agent.name.as_str(), agent.title.as_str()),
        ("Maya", "Design Thinking Maestro")
    );
    assert_eq!(agent.icon.as_deref(), Some("🎨"));
    assert_eq!(
        agent.persona.role,
        "Human-Centered Design Expert + Empathy Architect"
    );
    assert!(
        agent
            .persona
            .principles
            .ends_with("I design with users, not for them.")
    );
    assert_eq!(
        agent.activation.len(),
        5,
        "the installer's generic init steps"
    );
    assert_eq!(agent.critical_actions.len(), 3);
    assert_eq!(
        agent.critical_actions[1].text,
        "Remember the users name is {user_name}"
    );
    assert_eq!(agent.critical_actions[0].line, 65);
    assert_eq!(agent.startup_steps(), &agent.critical_actions[..]);
    assert_eq!(agent.rules.len(), 3);
    let triggers: Vec<&str> = agent.commands.iter().map(|c| c.trigger.as_str()).collect();
    assert_eq!(triggers, ["help", "design", "exit"]);
    assert_eq!(
        agent.commands[1].handler(HandlerKind::Workflow),
        Some(DESIGN)
    );
    assert_eq!(agent.commands[1].line, 71);
}

#[test]
fn the_compiled_form_parses() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED).definition;
    assert_eq!(
        (agent.name.as_str(), agent.title.as_str()),
        ("Bob", "Scrum Master")
    );
    assert_eq!(agent.activation.len(), 8);
    assert!(agent.critical_actions.is_empty());
    assert_eq!(agent.startup_steps().len(), 8);
    assert!(
        agent.activation[1]
            .text
            .contains("{project-root}/_bmad/bmm/config.yaml")
    );
    assert_eq!(agent.rules.len(), 4);
    let triggers: Vec<&str> = agent.commands.iter().map(|c| c.trigger.as_str()).collect();
    assert_eq!(triggers, ["MH", "CH", "SP", "CS", "ER", "CC", "PM", "DA"]);
    let sp = &agent.commands[2];
    assert_eq!(sp.aliases, ["sprint-planning"]);
    assert!(
        sp.description.starts_with("Sprint Planning: Generate"),
        "{}",
        sp.description
    );
    assert_eq!(sp.handler(HandlerKind::Workflow), Some(SPRINT));
    let er = &agent.commands[4];
    assert_eq!(
        er.handlers.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [HandlerKind::Workflow, HandlerKind::Data]
    );
    assert_eq!(
        agent.commands[6]
            .handler(HandlerKind::Exec)
            .map(|e| e.ends_with("party-mode/workflow.md")),
        Some(true)
    );
    assert_eq!(
        agent.commands[7].aliases,
        ["exit", "leave", "goodbye", "dismiss agent"]
    );
    assert_eq!(
        agent.find_command("*sprint-planning").map(|(i, _)| i),
        Some(2)
    );
    assert_eq!(agent.find_command("*cs").map(|(i, _)| i), Some(3));
}

#[test]
fn start_up_reads_only_the_agent_and_its_config() {
    let project = Project::copy("v6-alpha0");
    let agent = project.start(ALPHA);
    assert_eq!(
        reads(&agent, &project),
        pairs(&[
            (
                "[project]/bmad/cis/agents/design-thinking-coach.md",
                "agent"
            ),
            ("[project]/bmad/cis/config.yaml", "start-up"),
        ])
    );
    let vars = agent.session.variables();
    assert_eq!(vars.value("user_name"), Some(Ok("Jane".to_owned())));
    assert_eq!(
        vars.value("output_folder")
            .map(|v| project.redact(&v.expect("succeeds"))),
        Some("[project]/docs".to_owned())
    );

    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    assert_eq!(
        reads(&agent, &project),
        pairs(&[
            ("[project]/_bmad/bmm/agents/sm.md", "agent"),
            ("[project]/_bmad/bmm/config.yaml", "start-up"),
        ])
    );
    // A bare relative output folder is under the project root.
    assert_eq!(
        agent
            .session
            .variables()
            .value("output_folder")
            .map(|v| project.redact(&v.expect("succeeds"))),
        Some("[project]/_bmad-output".to_owned())
    );
    assert_eq!(
        project.redact(&agent.session.sandbox().write_root().display().to_string()),
        "[project]/_bmad-output"
    );
}

#[test]
fn the_project_root_is_inferred_from_the_start_up_files_inside_the_working_directory() {
    for (tree, rel) in [("v6-alpha0", ALPHA), ("v6-installed", COMPILED)] {
        let project = Project::copy(tree);
        // Run from the project, or from a folder above it: the bundle's project is found.
        let above = project.root().parent().expect("a parent").to_owned();
        for here in [project.root(), above] {
            let options = StartOptions {
                project_root: None,
                working_dir: Some(here.clone()),
                ..project.options()
            };
            let agent = StartedAgent::start(&project.path(rel), &options).expect("starts");
            assert_eq!(
                agent.session.roots().project,
                project.root(),
                "{tree} {here:?}"
            );
        }
        // Run from inside the bundle: never above the working directory.
        let inside = project.path(rel).parent().expect("agents/").to_owned();
        let options = StartOptions {
            project_root: None,
            working_dir: Some(inside.clone()),
            ..project.options()
        };
        let err = StartedAgent::start(&project.path(rel), &options).expect_err("no config");
        assert!(
            err.to_string().contains(&format!("`{}/", inside.display())),
            "the config is looked for in the working directory: {err}"
        );
    }
}

#[test]
fn roots_are_the_module_and_the_core_beside_it() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    let roots = agent.session.roots();
    assert_eq!(roots.bundle, project.path("_bmad/bmm"));
    assert_eq!(roots.core, project.path("_bmad/core"));
}

#[test]
fn prompts_of_both_forms() {
    for (tree, rel, name) in [
        ("v6-alpha0", ALPHA, "hand_written"),
        ("v6-installed", COMPILED, "compiled"),
    ] {
        let project = Project::copy(tree);
        let agent = project.start(rel);
        insta::assert_snapshot!(
            format!("{name}_system_prompt"),
            project.redact(&agent.system_prompt)
        );
        insta::assert_snapshot!(
            format!("{name}_startup_message"),
            project.redact(&agent.startup_message)
        );
        insta::assert_snapshot!(format!("{name}_menu"), agent.menu());
        assert_eq!(agent.messages().len(), 2);
    }
}

#[test]
fn picking_a_command_by_name_or_number() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    let by_name = agent
        .command_message("*sprint-planning")
        .expect("a command");
    assert_eq!(
        agent.command_message("3").as_deref(),
        Some(by_name.as_str())
    );
    assert_eq!(
        agent.command_message("*sp").as_deref(),
        Some(by_name.as_str())
    );
    insta::assert_snapshot!(project.redact(&by_name), @r"
    Run command 3, `*SP`: Sprint Planning: Generate or update the record that will sequence the tasks to complete the full project that the dev agent will follow
    Its handlers:
    - `workflow`: `[project]/_bmad/bmm/workflows/4-implementation/sprint-planning/workflow.yaml`
    ");
    assert_eq!(
        agent.command_message("sprint planning please"),
        None,
        "plain text is a message"
    );
    assert_eq!(agent.command_message("9"), None);
    assert_eq!(agent.command_message("*nothing"), None);
}

#[tokio::test]
async fn execute_workflow_loads_the_hand_written_workflow_with_its_files() {
    let project = Project::copy("v6-alpha0");
    let agent = project.start(ALPHA);
    let before = agent.session.file_log().len();
    let context = tool(&agent, "execute_workflow")
        .call(json!({"workflow_path": DESIGN}), &ctx())
        .await
        .expect("the workflow loads");
    let text = |v: &Value| project.redact(v.as_str().expect("a string"));
    assert_eq!(context["workflow"], "design-thinking");
    assert_eq!(
        text(&context["default_output_file"]),
        format!("[project]/docs/design-thinking-{DATE}.md")
    );
    let vars = &context["variables"];
    assert_eq!(vars["user_name"], "Jane");
    assert_eq!(vars["date"], DATE);
    assert_eq!(text(&vars["output_folder"]), "[project]/docs");
    assert_eq!(
        text(&vars["recommended_inputs"][1]["user_research"]),
        "[project]/docs/research-*.md"
    );
    let instructions = context["instructions"]["content"]
        .as_str()
        .expect("instructions");
    assert!(instructions.contains("<step n=\"1\""), "{instructions}");
    // `{project_root}` (sic) and `{design_methods}` are filled in; prose braces stay.
    assert!(!instructions.contains("{design_methods}"));
    assert!(instructions.contains(&format!(
        "{}/bmad/cis/workflows/design-thinking/design-methods.csv",
        project.root().display()
    )));
    let template = context["template"]["content"].as_str().expect("template");
    assert!(
        template.contains("{{challenge_statement}}") && template.contains("{{date}}"),
        "the template is as written"
    );
    let files = context["files"].as_array().expect("files");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0]["key"], "design_methods");
    assert!(
        files[0]["content"]
            .as_str()
            .expect("succeeds")
            .starts_with("phase,method_name,description")
    );
    let read: Vec<String> = agent.session.file_log().entries()[before..]
        .iter()
        .map(|a| project.redact(&a.path.display().to_string()))
        .collect();
    let dir = "[project]/bmad/cis/workflows/design-thinking";
    assert_eq!(
        read,
        [
            format!("{dir}/workflow.yaml"),
            format!("{dir}/instructions.md"),
            format!("{dir}/template.md"),
            format!("{dir}/design-methods.csv"),
        ],
        "the config loaded at start-up is not read again"
    );
}

#[tokio::test]
async fn execute_workflow_resolves_chained_keys_and_a_yaml_template() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    let context = tool(&agent, "execute_workflow")
        .call(json!({"workflow_path": SPRINT}), &ctx())
        .await
        .expect("the workflow loads");
    let text = |v: &Value| project.redact(v.as_str().expect("a string"));
    assert_eq!(
        text(&context["default_output_file"]),
        "[project]/_bmad-output/implementation-artifacts/sprint-status.yaml"
    );
    assert_eq!(context["variables"]["project_name"], "sample-project");
    assert_eq!(
        context["variables"]["project_context"],
        "**/project-context.md"
    );
    assert_eq!(
        text(&context["variables"]["input_file_patterns"]["epics"]["whole"]),
        "[project]/_bmad-output/planning-artifacts/*epic*.md"
    );
    assert!(
        context["template"]["path"]
            .as_str()
            .expect("succeeds")
            .ends_with("sprint-status-template.yaml")
    );
    let keys: Vec<&str> = context["files"]
        .as_array()
        .expect("succeeds")
        .iter()
        .map(|f| f["key"].as_str().expect("succeeds"))
        .collect();
    assert_eq!(keys, ["validation"]);

    let story = tool(&agent, "execute_workflow")
        .call(json!({"workflow_path": STORY}), &ctx())
        .await
        .expect("the workflow loads");
    assert_eq!(
        text(&story["default_output_file"]),
        "[project]/_bmad-output/implementation-artifacts/{{story_key}}.md"
    );
    assert!(
        story["instructions"]["path"]
            .as_str()
            .expect("succeeds")
            .ends_with("instructions.xml")
    );
    assert_eq!(story["variables"]["story_title"], "");
}

#[tokio::test]
async fn execute_workflow_takes_the_user_input_and_a_data_file() {
    let project = Project::copy("v6-alpha0");
    std::fs::write(project.path("brief.md"), "A brief.").expect("succeeds");
    let agent = project.start(ALPHA);
    let input = json!({"data": "{project-root}/brief.md", "user_name": "Sam"});
    let context = tool(&agent, "execute_workflow")
        .call(
            json!({"workflow_path": DESIGN, "user_input": input}),
            &ctx(),
        )
        .await
        .expect("loads");
    assert_eq!(context["data"]["content"], "A brief.");
    assert_eq!(context["user_input"], input);
    assert_eq!(
        context["variables"]["user_name"], "Sam",
        "the user's value wins"
    );
    let err = tool(&agent, "execute_workflow")
        .call(
            json!({"workflow_path": DESIGN, "user_input": {"project-root": "/"}}),
            &ctx(),
        )
        .await
        .expect_err("the roots are the agent's");
    assert!(
        err.to_string()
            .contains("`user_input.project-root` cannot be set"),
        "{err}"
    );
}

/// The agent-bundle specification's schemas, exactly; a wrong name fails the schema check
/// with both names in the error.
#[tokio::test]
async fn the_file_tools_take_the_specified_parameters() {
    let project = Project::copy("v6-alpha0");
    let agent = project.start(ALPHA);
    let schemas: Vec<(String, Value)> = agent
        .tools()
        .iter()
        .map(|t| (t.name().to_owned(), t.parameters()))
        .collect();
    let strip = |mut schema: Value| {
        // Descriptions are for the model; the shape is what the specification fixes.
        if let Some(props) = schema["properties"].as_object_mut() {
            for prop in props.values_mut() {
                if let Some(prop) = prop.as_object_mut() {
                    prop.remove("description");
                }
            }
        }
        schema
    };
    let shapes: Vec<(String, Value)> = schemas.into_iter().map(|(n, s)| (n, strip(s))).collect();
    assert_eq!(
        shapes,
        [
            (
                "read_file".to_owned(),
                json!({"type": "object", "properties": {"file_path": {"type": "string"}},
                       "required": ["file_path"], "additionalProperties": false})
            ),
            (
                "execute_workflow".to_owned(),
                json!({"type": "object", "properties": {"workflow_path": {"type": "string"},
                       "user_input": {"type": "object"}},
                       "required": ["workflow_path"], "additionalProperties": false})
            ),
            (
                "save_output".to_owned(),
                json!({"type": "object", "properties": {"file_path": {"type": "string"},
                       "content": {"type": "string"}},
                       "required": ["file_path", "content"], "additionalProperties": false})
            ),
        ]
    );
    let toolbox = agent
        .tools()
        .into_iter()
        .try_fold(engine::Toolbox::new(), |b, t| b.with(t))
        .expect("a toolbox");
    let call = bridge::ToolCall {
        id: "c1".into(),
        name: "read_file".into(),
        arguments: r#"{"path": "docs/brief.md"}"#.into(),
    };
    let err = toolbox.prepare(&call).err().expect("refused").to_string();
    assert_eq!(
        err,
        "The arguments of `read_file` do not fit its parameters: missing properties \
         'file_path'; additionalProperties 'path' not allowed; fix them and \
         call `read_file` again"
    );
}

#[tokio::test]
async fn save_output_writes_whole_documents_under_the_output_folder() {
    let project = Project::copy("v6-alpha0");
    let agent = project.start(ALPHA);
    let save = tool(&agent, "save_output");
    let out = save
        .call(
            json!({"file_path": "{output_folder}/design-thinking-{{date}}.md", "content": "# Design\n"}),
            &ctx(),
        )
        .await
        .expect("saved");
    let path = project.path(&format!("docs/design-thinking-{DATE}.md"));
    assert_eq!(out["path"], json!(path));
    save.call(
        json!({"file_path": path, "content": "# Design\n## Step 2\n"}),
        &ctx(),
    )
    .await
    .expect("replaced");
    assert_eq!(
        std::fs::read_to_string(&path).expect("succeeds"),
        "# Design\n## Step 2\n"
    );
    let saved = save
        .call(
            json!({"file_path": "{output_folder}/new/deeper/doc.md", "content": "x"}),
            &ctx(),
        )
        .await
        .expect("folders are made");
    assert_eq!(saved["bytes"], 1);
    let log = agent.session.file_log().entries();
    let ops: Vec<FileOp> = log.iter().skip(2).map(|a| a.op).collect();
    assert_eq!(ops, [FileOp::Write, FileOp::Write, FileOp::Write]);
    assert!(log.iter().skip(2).all(|a| a.by == "save_output"));
}

#[tokio::test]
async fn save_output_refuses_a_template_value_left_in_the_path() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    let err = tool(&agent, "save_output")
        .call(
            json!({"file_path": "{implementation_artifacts}/{{story_key}}.md", "content": "x"}),
            &ctx(),
        )
        .await
        .expect_err("fails");
    assert_eq!(
        err.to_string(),
        "`{implementation_artifacts}/{{story_key}}.md` still holds the template value `{{story_key}}`; put its value in the path first"
    );
}

#[tokio::test]
async fn an_unknown_variable_lists_the_ones_available() {
    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    let err = tool(&agent, "read_file")
        .call(json!({"file_path": "{secrets}/key.txt"}), &ctx())
        .await
        .expect_err("fails");
    insta::assert_snapshot!(err.to_string(), @"Unknown variable `{secrets}` in `{secrets}/key.txt`; the variables available are: `{bundle-root}`, `{communication_language}`, `{core-root}`, `{date}`, `{document_output_language}`, `{implementation_artifacts}`, `{output_folder}`, `{planning_artifacts}`, `{project-root}`, `{project_knowledge}`, `{project_name}`, `{project_root}`, `{user_name}`, `{user_skill_level}`");
}

#[test]
fn a_missing_start_up_file_halts_start_up() {
    let project = Project::copy("v6-installed");
    std::fs::remove_file(project.path("_bmad/bmm/config.yaml")).expect("succeeds");
    let err = StartedAgent::start(&project.path(COMPILED), &project.options()).expect_err("fails");
    assert!(matches!(err, BundleError::StartupFile { .. }), "{err:?}");
    assert_eq!(
        project.redact(&err.to_string()),
        "Start-up step 2 of `[project]/_bmad/bmm/agents/sm.md` loads `{project-root}/_bmad/bmm/config.yaml`, which failed: `[project]/_bmad/bmm/config.yaml` does not exist"
    );
}

#[test]
fn a_malformed_config_halts_start_up_naming_its_line() {
    let project = Project::copy("v6-alpha0");
    std::fs::write(
        project.path("bmad/cis/config.yaml"),
        "user_name: Jane\noutput_folder: [docs\n",
    )
    .expect("succeeds");
    let err = StartedAgent::start(&project.path(ALPHA), &project.options()).expect_err("fails");
    let text = project.redact(&err.to_string());
    assert!(
        text.starts_with("Start-up step 1 of `[project]/bmad/cis/agents/design-thinking-coach.md` loads `{project-root}/bmad/cis/config.yaml`, which failed: `[project]/bmad/cis/config.yaml` line "),
        "{text}"
    );
    assert!(text.contains("This is not valid YAML"), "{text}");
}

#[tokio::test]
async fn invoke_agent_names_the_agents_of_the_bundle() {
    use bridge::{Budget, Endpoint, EndpointConfig, Ledger};
    use engine::agent::LoopConfig;
    use engine::bundle::agent_tools;

    let project = Project::copy("v6-installed");
    let agent = project.start(COMPILED);
    // Never called: the unknown name is refused before any model call.
    let config = EndpointConfig::openai("root", "http://127.0.0.1:9/v1", "m");
    let endpoint = Endpoint::new(config, std::sync::Arc::new(Ledger::new(Budget::default())))
        .expect("endpoint");
    let tools = agent_tools(
        &agent,
        std::sync::Arc::new(endpoint),
        LoopConfig::default(),
        None,
    );
    let invoke = tools
        .iter()
        .find(|t| t.name() == "invoke_agent")
        .expect("invoke_agent");
    assert!(
        invoke.description().ends_with("Agents: `sm`."),
        "{}",
        invoke.description()
    );
    assert_eq!(
        invoke.parameters()["properties"]["agent"]["enum"],
        json!(["sm"])
    );
    let err = invoke
        .call(json!({"agent": "../../secret", "message": "hi"}), &ctx())
        .await
        .expect_err("refused");
    assert_eq!(
        project.redact(&err.to_string()),
        "No agent `../../secret` in `[project]/_bmad/bmm/agents`; the agents are: `sm`"
    );
}
