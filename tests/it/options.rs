//! Every option of the schema works in `rlm run` from each of its sources — `rlm.toml`, its
//! `RLM_*` variable, its flag — generated from `kernel::options::OPTIONS`, so an option added
//! to the schema is covered here the day it is added. A dry run with `--json` shows the
//! options it resolved; each must come out as the schema reads its example.

use std::path::Path;

use kernel::options::{Group, Kind, OPTIONS, OptionSpec};
use serde_json::Value;

use crate::support::{file, rlm_with};

/// A variable the examples name (`--secret`, `--api-key-env`), long enough to redact.
const VARIABLE: (&str, &str) = ("MY_VARIABLE", "a-secret-value-of-some-length");

/// The options `rlm run` offers: all but the agent bundle's roots (`rlm agent`'s, covered
/// in `agent.rs`) and the run database of workflows (`rlm flow`'s, covered in
/// `flow_postgres.rs` and `flow_durable.rs`).
fn run_options() -> impl Iterator<Item = &'static OptionSpec> {
    OPTIONS
        .iter()
        .filter(|spec| !matches!(spec.group, Group::Agent | Group::Database | Group::Lease))
}

/// What the schema makes of `spec`'s example; paths from `rlm.toml` are relative to it.
fn expected(spec: &OptionSpec, file_dir: Option<&Path>) -> Value {
    let value = spec
        .parse_json(&Value::from(spec.example))
        .expect("the schema's own examples parse");
    match (spec.kind, file_dir) {
        (Kind::Path, Some(dir)) => Value::from(dir.join(spec.example).to_str().expect("utf-8")),
        _ => value,
    }
}

/// The example as TOML, in the type a user would write.
fn toml_value(spec: &OptionSpec) -> String {
    let value = expected(spec, None);
    match value {
        Value::String(text) => toml::Value::String(text).to_string(),
        other => toml::Value::try_from(other).expect("TOML").to_string(),
    }
}

/// `rlm run --dry-run --json` over a small context in `dir` with `args` and `envs`: the
/// options it resolved.
fn dry_run(dir: &Path, args: &[String], envs: &[(&str, &str)]) -> serde_json::Map<String, Value> {
    let context = file(dir, "c.txt", "some text");
    let mut all: Vec<String> = ["run", "--dry-run", "--json", "--query", "q", "--context"]
        .map(str::to_owned)
        .to_vec();
    all.push(context.to_str().expect("utf-8").to_owned());
    all.extend_from_slice(args);
    let run = rlm_with(&all, None, envs);
    run.assert_code(0);
    match run.json()["options"].clone() {
        Value::Object(options) => options,
        other => panic!("no options in the dry run's JSON: {other}\n{}", run.stdout),
    }
}

fn assert_every(
    options: &serde_json::Map<String, Value>,
    specs: &[&OptionSpec],
    dir: Option<&Path>,
) {
    for spec in specs {
        assert_eq!(
            options.get(spec.name),
            Some(&expected(spec, dir)),
            "option `{}`",
            spec.name
        );
    }
}

#[test]
fn every_rlm_toml_key_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    file(dir.path(), "file.md", "Extra instructions.\n");
    let mut text = String::from("[run]\n");
    for spec in run_options() {
        text.push_str(&format!("{} = {}\n", spec.file_key(), toml_value(spec)));
    }
    let config = file(dir.path(), "rlm.toml", &text);
    let options = dry_run(
        dir.path(),
        &[
            "--config".to_owned(),
            config.to_str().expect("utf-8").to_owned(),
        ],
        &[VARIABLE],
    );
    let every: Vec<&OptionSpec> = run_options().collect();
    assert_every(&options, &every, Some(dir.path()));
}

#[test]
fn every_environment_variable_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with_env: Vec<&OptionSpec> = run_options().filter(|s| s.env.is_some()).collect();
    let mut envs: Vec<(&str, &str)> = with_env
        .iter()
        .filter_map(|s| Some((s.env?, s.example)))
        .collect();
    envs.push(VARIABLE);
    // A dry run with `--json` from the flag; every other option from the environment.
    let options = dry_run(dir.path(), &[], &envs);
    assert_every(&options, &with_env, None);
}

#[test]
fn every_flag_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = file(dir.path(), "file.md", "Extra instructions.\n");
    let mut args = Vec::new();
    for spec in run_options().filter(|s| s.name != "json") {
        let value = match spec.kind {
            Kind::Path => prompt
                .to_str()
                .expect("utf-8")
                .replace("file.md", spec.example),
            _ => spec.example.to_owned(),
        };
        match spec.kind {
            Kind::Switch => args.push(format!("--{}={value}", spec.flag_name())),
            _ => args.extend([format!("--{}", spec.flag_name()), value]),
        }
    }
    let options = dry_run(dir.path(), &args, &[VARIABLE]);
    let every: Vec<&OptionSpec> = run_options().collect();
    assert_every(&options, &every, Some(dir.path()));
}
