//! The schema's own checks: every option, from its `example`, through every source; the
//! layering; and the resolution to configurations.

#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

use std::time::Duration;

use serde_json::{Map, Value};

use super::*;

fn model() -> RunOptions {
    RunOptions {
        model: Some("m".into()),
        base_url: Some("http://127.0.0.1:9/v1".into()),
        ..RunOptions::default()
    }
}

/// The canonical value of `spec`'s example.
fn example(spec: &OptionSpec) -> Value {
    spec.parse_json(&Value::from(spec.example)).unwrap()
}

#[test]
fn every_option_has_help_a_unique_flag_and_a_valid_example() {
    let mut flags = std::collections::HashSet::new();
    for spec in OPTIONS {
        assert!(!spec.help_text().is_empty(), "{} has no help", spec.name);
        assert_ne!(
            ALL_GROUPS & spec.group.bit(),
            0,
            "{}: its group is not in `ALL_GROUPS`",
            spec.name
        );
        assert!(
            flags.insert(spec.flag_name()),
            "flag of {} is taken",
            spec.name
        );
        let value = spec
            .parse_text(spec.example)
            .unwrap_or_else(|e| panic!("{}: example `{}` {e}", spec.name, spec.example));
        if spec.repeated {
            assert_eq!(example(spec), Value::Array(vec![value]));
        }
        // The canonical form reads into the typed field and back unchanged.
        let map = Map::from_iter([(spec.name.to_owned(), example(spec))]);
        let options = RunOptions::from_canonical(map.clone())
            .unwrap_or_else(|e| panic!("{}: kind and field type disagree: {e}", spec.name));
        assert_eq!(options.to_map(), map, "{}", spec.name);
    }
}

#[test]
fn every_option_reads_from_every_source_it_has() {
    let dir = tempfile::tempdir().unwrap();
    for spec in OPTIONS {
        let expected = Map::from_iter([(spec.name.to_owned(), example(spec))]);
        let flags =
            RunOptions::from_text(&Source::Flag, [(spec.name, vec![spec.example.into()])]).unwrap();
        assert_eq!(flags.to_map(), expected, "flag of {}", spec.name);
        let keywords = RunOptions::from_json(
            &Source::Keyword,
            &Map::from_iter([(spec.name.to_owned(), Value::from(spec.example))]),
        )
        .unwrap();
        assert_eq!(keywords.to_map(), expected, "keyword {}", spec.name);
        if let Some(var) = spec.env {
            let env =
                RunOptions::from_env_with(|v| (v == var).then(|| spec.example.to_owned())).unwrap();
            assert_eq!(env.to_map(), expected, "{var}");
        }
        let file = dir.path().join(format!("{}.toml", spec.name));
        let toml_value = match example(spec) {
            Value::String(text) => toml::Value::String(text),
            other => toml::Value::try_from(other).unwrap(),
        };
        let mut table = toml::Table::new();
        table.insert(spec.file_key(), toml_value);
        let text = toml::to_string(&toml::Table::from_iter([(
            "run".to_owned(),
            toml::Value::Table(table),
        )]))
        .unwrap();
        std::fs::write(&file, text).unwrap();
        let mut read = RunOptions::from_file(&file).unwrap().to_map();
        if spec.kind == Kind::Path {
            // Relative to the file.
            let joined = dir.path().join(spec.example);
            assert_eq!(
                read.remove(spec.name),
                Some(Value::from(joined.to_str().unwrap()))
            );
        } else {
            assert_eq!(read, expected, "`{}` in rlm.toml", spec.file_key());
        }
    }
}

#[test]
fn errors_name_the_option_as_its_source_spells_it() {
    let bad = |source: &Source| {
        let given = [("max_iterations", vec!["0".to_owned()])];
        match source {
            Source::Keyword => RunOptions::from_json(
                source,
                &Map::from_iter([("max_iterations".to_owned(), Value::from(0))]),
            ),
            _ => RunOptions::from_text(source, given),
        }
        .unwrap_err()
        .to_string()
    };
    assert_eq!(bad(&Source::Flag), "`--max-iterations` must be ≥ 1, got 0");
    assert_eq!(bad(&Source::Keyword), "`max_iterations` must be ≥ 1, got 0");
    let env = RunOptions::from_env_with(|v| (v == "RLM_CELL_TIMEOUT").then(|| "-1".into()));
    assert_eq!(
        env.unwrap_err().to_string(),
        "`RLM_CELL_TIMEOUT` must be a positive number of seconds up to 315360000, got `-1`"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rlm.toml");
    std::fs::write(&file, "[run]\nprovider = \"palm\"\n").unwrap();
    let err = RunOptions::from_file(&file).unwrap_err();
    assert!(!err.is_usage(), "a file's mistake is not a usage error");
    assert_eq!(
        err.to_string(),
        format!(
            "`provider` in `{}` must be one of `openai`, `anthropic`, got `palm`",
            file.display()
        )
    );
    std::fs::write(&file, "[run]\nmax-iteratons = 3\n").unwrap();
    let err = RunOptions::from_file(&file).unwrap_err().to_string();
    assert!(
        err.contains("unknown option `max-iteratons` in `[run]`"),
        "{err}"
    );
    let err = RunOptions::from_json(
        &Source::Keyword,
        &Map::from_iter([("max_iteration".to_owned(), Value::from(3))]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(
            "Unknown option `max_iteration` in the keyword arguments; the options are `csv_sep`"
        ),
        "{err}"
    );
}

#[test]
fn layers_combine_first_set_wins_and_lists_add_up() {
    let flags = RunOptions {
        max_iterations: Some(2),
        secrets: Some(vec!["A_SECRET".into()]),
        ..RunOptions::default()
    };
    let file = RunOptions {
        max_iterations: Some(9),
        model: Some("from-file".into()),
        secrets: Some(vec!["B_SECRET".into()]),
        ..RunOptions::default()
    };
    let merged = flags.combine(file);
    assert_eq!(merged.max_iterations, Some(2));
    assert_eq!(merged.model.as_deref(), Some("from-file"));
    assert_eq!(
        merged.secrets,
        Some(vec!["A_SECRET".to_owned(), "B_SECRET".to_owned()])
    );
    let kept = merged.only(Group::Iterations.bit() | Group::Models.bit());
    assert_eq!(
        (kept.max_iterations, kept.secrets.map(|s| s.len())),
        (Some(2), Some(2))
    );
    assert_eq!(
        RunOptions {
            json: Some(true),
            ..model()
        }
        .only(Group::Models.bit())
        .json,
        None
    );
}

#[test]
fn resolution_errors_name_the_option_as_each_front_end_spells_it() {
    let bad = RunOptions {
        sub_price: Some("1:-2".into()),
        ..model()
    };
    let message = |s| bad.endpoint_configs(s).unwrap_err().to_string();
    assert_eq!(
        message(Spelling::Flag),
        "`--sub-price` takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `1:-2`"
    );
    assert_eq!(
        message(Spelling::Keyword),
        "`sub_price` takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `1:-2`"
    );
    let unpriced = RunOptions {
        max_usd: Some(1.0),
        ..model()
    };
    assert_eq!(
        unpriced
            .endpoints(Spelling::Keyword, Keys::Required)
            .unwrap_err()
            .to_string(),
        "`max_usd` needs prices to count cost; pass `price=\"INPUT:OUTPUT\"` (USD per million tokens)"
    );
    let extra = RunOptions {
        extra_models: Some(vec!["sub=other".into()]),
        ..model()
    };
    assert_eq!(
        extra
            .endpoints(Spelling::Flag, Keys::Required)
            .unwrap_err()
            .to_string(),
        "`--extra-model` entry `sub=other`: the name `sub` is taken; pick another"
    );
    let none = RunOptions::default()
        .endpoints(Spelling::Flag, Keys::Required)
        .unwrap_err();
    assert!(none.is_usage());
    assert_eq!(
        none.to_string(),
        "No root model given; pass `--model NAME` (or set `RLM_MODEL`, or `model` in rlm.toml)"
    );
    let remote = RunOptions {
        base_url: Some("https://models.example.invalid/v1".into()),
        api_key_env: Some("RLM_TEST_KEY_THAT_IS_NOT_SET".into()),
        ..model()
    };
    assert_eq!(
        remote
            .endpoints(Spelling::Keyword, Keys::Required)
            .unwrap_err()
            .to_string(),
        "`https://models.example.invalid/v1` needs an API key and `RLM_TEST_KEY_THAT_IS_NOT_SET` \
         is not set; export `RLM_TEST_KEY_THAT_IS_NOT_SET` with your key, or name the variable \
         that holds it with `api_key_env=\"VAR\"`"
    );
    assert!(remote.endpoints(Spelling::Keyword, Keys::Optional).is_ok());
    let bad_extra_url = RunOptions {
        extra_models: Some(vec!["judge=big@localhost:1/v1".into()]),
        ..model()
    };
    assert_eq!(
        bad_extra_url
            .endpoint_configs(Spelling::Flag)
            .unwrap_err()
            .to_string(),
        "The URL of `--extra-model judge=big@localhost:1/v1` must start with `http://` or \
         `https://`, got `localhost:1/v1`"
    );
}

#[test]
fn root_sub_and_extra_endpoints_share_the_defaults() {
    let options = RunOptions {
        sub_model: Some("small".into()),
        price: Some("1:2".into()),
        sub_timeout: Some(5.0),
        max_sub_calls: Some(7),
        extra_models: Some(vec![
            "judge=big@http://127.0.0.1:10/v1".into(),
            "cheap=tiny".into(),
        ]),
        ..model()
    };
    let (configs, budget) = options.endpoint_configs(Spelling::Flag).unwrap();
    let names: Vec<(&str, &str, &str)> = configs
        .iter()
        .map(|c| (c.name.as_str(), c.model.as_str(), c.base_url.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("root", "m", "http://127.0.0.1:9/v1"),
            ("sub", "small", "http://127.0.0.1:9/v1"),
            ("judge", "big", "http://127.0.0.1:10/v1"),
            ("cheap", "tiny", "http://127.0.0.1:9/v1"),
        ]
    );
    assert!(!configs[0].counts_toward_call_budget);
    assert_eq!(
        configs[1].price, configs[0].price,
        "`sub_price` defaults to `price`"
    );
    assert_eq!(configs[1].timeout, Duration::from_secs(5));
    assert_eq!(
        configs[3].timeout,
        Duration::from_secs(5),
        "extras are like `sub`"
    );
    assert_eq!(budget.max_calls, Some(7));
}

#[test]
fn sizes_parse_with_units_and_refuse_nonsense() {
    let size = OptionSpec::new(Kind::Size { min: 1 << 20 }, Group::Session);
    let bytes = |text: &str| size.parse_text(text).map(|v| v.as_u64().unwrap());
    assert_eq!(bytes("4G"), Ok(4 << 30));
    assert_eq!(bytes("512 MiB"), Ok(512 << 20));
    assert_eq!(bytes("1.5g"), Ok(3 << 29));
    assert_eq!(bytes("2097152"), Ok(2 << 20));
    assert_eq!(bytes(" 1m "), Ok(1 << 20));
    assert_eq!(bytes("10"), Err("must be at least 1M, got `10`".to_owned()));
    for bad in ["", "lots", "4X", "-1G", "1e400", "99999999T"] {
        assert!(
            bytes(bad)
                .unwrap_err()
                .starts_with("must be a size such as `4G`"),
            "{bad}"
        );
    }
    // From `rlm.toml` or a keyword: a number of bytes, or the same text.
    assert_eq!(
        size.parse_json(&Value::from(3u64 << 30)),
        Ok(Value::from(3u64 << 30))
    );
    assert_eq!(
        size.parse_json(&Value::from("3G")),
        Ok(Value::from(3u64 << 30))
    );
    assert_eq!(
        size.parse_json(&Value::Bool(true)),
        Err("must be a size such as `4G` or a number of bytes, got `true`".to_owned())
    );
}

#[test]
fn the_session_runs_confined_unless_asked_otherwise() {
    use crate::repl::{Isolation, OnCrash};
    let config = model().session_config(Spelling::Flag).unwrap();
    assert_eq!(
        config.isolation,
        Isolation::Process,
        "model code runs confined unless asked otherwise"
    );
    assert_eq!(
        (config.memory_limit, config.on_crash),
        (None, OnCrash::Restore)
    );
    let env = RunOptions::from_env_with(|var| match var {
        "RLM_ISOLATION" => Some("none".into()),
        "RLM_MEMORY_LIMIT" => Some("3G".into()),
        "RLM_ON_CRASH" => Some("fresh".into()),
        _ => None,
    })
    .unwrap();
    let config = env.session_config(Spelling::Flag).unwrap();
    assert_eq!(config.isolation, Isolation::None);
    assert_eq!(config.memory_limit, Some(3 << 30));
    assert_eq!(config.on_crash, OnCrash::Fresh);
    // A limit set in Rust, past the sources, is checked too.
    let tiny = RunOptions {
        memory_limit: Some(10),
        ..model()
    };
    assert_eq!(
        tiny.session_config(Spelling::Flag).unwrap_err().to_string(),
        "`--memory-limit` must be at least 1M, got `10`"
    );
}

#[test]
fn a_missing_prompt_file_is_not_a_usage_error() {
    let options = RunOptions {
        system_prompt: Some("/nonexistent/system.md".into()),
        ..model()
    };
    let err = options.rlm_config(Spelling::Flag).unwrap_err();
    assert!(!err.is_usage());
    assert_eq!(
        err.to_string(),
        "Could not read the `--system-prompt` file `/nonexistent/system.md`"
    );
}

#[test]
fn each_kind_refuses_what_it_does_not_take() {
    let kind = |kind: Kind| OptionSpec::new(kind, Group::Models);
    let refused = |kind: Kind, text: &str| kind_check(kind, text).unwrap_err();
    fn kind_check(kind: Kind, text: &str) -> Result<Value, String> {
        OptionSpec::new(kind, Group::Models).parse_text(text)
    }
    assert_eq!(
        kind(Kind::Character).parse_text("tab"),
        Ok(Value::from("\t"))
    );
    assert_eq!(
        kind(Kind::Character).parse_text("\\t"),
        Ok(Value::from("\t"))
    );
    for bad in [";;", "\"", "é", ""] {
        assert!(refused(Kind::Character, bad).starts_with("takes one ASCII character"));
    }
    for bad in ["", "A=B", "A\0B"] {
        assert!(refused(Kind::Variable, bad).starts_with("takes the name of an environment"));
    }
    assert_eq!(
        refused(Kind::Url, "localhost:8000/v1"),
        "must start with `http://` or `https://`, got `localhost:8000/v1`"
    );
    assert_eq!(refused(Kind::Whole { min: 1 }, "-1"), "must be ≥ 1, got -1");
    assert!(refused(Kind::Seconds, "0").starts_with("must be a positive number of seconds"));
    assert!(refused(Kind::Usd, "NaN").starts_with("must be a positive amount of USD"));
    assert_eq!(
        refused(Kind::Switch, "maybe"),
        "must be `true` or `false`, got `maybe`"
    );
    assert_eq!(
        kind(Kind::Whole { min: 0 }).parse_json(&Value::Bool(true)),
        Err("must be a whole number, got `true`".to_owned())
    );
    assert_eq!(
        kind(Kind::Width).parse_json(&Value::from(8)),
        Ok(Value::from(8)),
        "a number from a keyword or `rlm.toml`"
    );
}

#[test]
fn a_run_database_is_a_path_relative_to_rlm_toml_or_a_url_whose_password_no_error_shows() {
    let dir = tempfile::tempdir().unwrap();
    let read = |value: &str| {
        let file = dir.path().join("rlm.toml");
        let mut table = toml::Table::new();
        table.insert("db".to_owned(), toml::Value::String(value.to_owned()));
        let text = toml::to_string(&toml::Table::from_iter([(
            "run".to_owned(),
            toml::Value::Table(table),
        )]))
        .unwrap();
        std::fs::write(&file, text).unwrap();
        RunOptions::from_file(&file).map(|options| options.db)
    };
    let beside = dir.path().join("runs/a.db").display().to_string();
    assert_eq!(read("runs/a.db").unwrap(), Some(beside.clone()));
    assert_eq!(read("sqlite:runs/a.db").unwrap(), Some(beside));
    assert_eq!(
        read("/var/rlm/runs.db").unwrap().as_deref(),
        Some("/var/rlm/runs.db")
    );
    let url = "postgres://rlm@db.internal:5433/runs";
    assert_eq!(read(url).unwrap().as_deref(), Some(url));

    // A URL that does not parse: the error names the option and never the password.
    let secret = "Zq-not-shown-81";
    let bad = format!("postgres://rlm:{secret}@db.internal:port/runs");
    let err = RunOptions::from_text(&Source::Flag, [("db", vec![bad.clone()])])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`--db` must be an SQLite path or a PostgreSQL URL"),
        "{err}"
    );
    assert!(!err.contains(secret), "{err}");
    let err = read(&bad).unwrap_err().to_string();
    assert!(err.contains("`db` in"), "{err}");
    assert!(!err.contains(secret), "{err}");
}
