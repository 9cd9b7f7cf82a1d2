//! `--input`: state values from the command line, in the forms httpie made familiar.
//!
//! `KEY=VALUE` is a string and `KEY=@FILE` a file's text; `KEY:=JSON` is a typed value (a
//! number, boolean, null, list, object, or a quoted string — `'KEY:="@home"'` for text
//! that starts with `@`) and `KEY:=@FILE` a JSON file. The key is everything before the
//! first `=` (or `:=`), so scoped keys such as `user:name=ada` keep their prefix.

use std::path::Path;

use serde_json::Value;

use crate::exit::UsageError;

/// One `--input` as a state key and value.
pub(crate) fn parse_input(input: &str) -> Result<(String, Value), UsageError> {
    let Some((head, value)) = input.split_once('=') else {
        return Err(not_key_value(input));
    };
    let (key, typed) = match head.strip_suffix(':') {
        Some(key) => (key.trim(), true),
        None => (head.trim(), false),
    };
    if key.is_empty() {
        return Err(not_key_value(input));
    }
    let sep = if typed { ":=" } else { "=" };
    let (text, file) = match value.strip_prefix('@') {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                UsageError::new(format!(
                    "`--input {key}{sep}@{path}`: cannot read `{path}`: {e}"
                ))
            })?;
            (text, Some(path))
        }
        None => (value.to_owned(), None),
    };
    if !typed {
        return Ok((key.to_owned(), Value::String(text)));
    }
    let value = serde_json::from_str(&text).map_err(|e| {
        let (file, as_text) = match file {
            Some(path) => (format!(" (the file `{path}`)"), format!("{key}=@{path}")),
            None => (String::new(), format!("{key}={value}")),
        };
        UsageError::new(format!(
            "The value of `{key}` in `--input {input}`{file} is not JSON ({e}); write JSON such \
             as `{key}:=3`, `{key}:=true`, `{key}:='[\"a\", \"b\"]'` or `{key}:='{{\"n\": 1}}'`, \
             or pass it as text: `{as_text}`"
        ))
    })?;
    Ok((key.to_owned(), value))
}

/// The file an `--input` reads (`KEY=@FILE`, `KEY:=@FILE`), if it names one.
pub(crate) fn input_file(input: &str) -> Option<&Path> {
    let (_, value) = input.split_once('=')?;
    value.strip_prefix('@').map(Path::new)
}

fn not_key_value(input: &str) -> UsageError {
    UsageError::new(format!(
        "`--input {input}` is not `KEY=VALUE`; e.g. `--input topic=sales`, \
         `--input template=@draft.md` or, for a number, boolean, list or object, \
         `--input rounds:=3`"
    ))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // The tests' fixtures.
mod tests {
    use serde_json::json;

    use super::*;

    fn ok(input: &str) -> (String, Value) {
        parse_input(input).unwrap_or_else(|e| panic!("{input}: {e}"))
    }

    fn err(input: &str) -> String {
        match parse_input(input) {
            Ok(parsed) => panic!("{input} parsed as {parsed:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn key_equals_value_is_text_and_key_colon_equals_json_is_typed() {
        assert_eq!(ok("topic=sales"), ("topic".into(), json!("sales")));
        assert_eq!(ok("n=3"), ("n".into(), json!("3")));
        assert_eq!(ok("empty="), ("empty".into(), json!("")));
        assert_eq!(ok("eq=a=b"), ("eq".into(), json!("a=b")));
        assert_eq!(ok("n:=3"), ("n".into(), json!(3)));
        assert_eq!(ok("x:=-0.5"), ("x".into(), json!(-0.5)));
        assert_eq!(ok("flag:=true"), ("flag".into(), json!(true)));
        assert_eq!(ok("none:=null"), ("none".into(), json!(null)));
        assert_eq!(ok("tags:=[\"a\", 2]"), ("tags".into(), json!(["a", 2])));
        assert_eq!(
            ok("cfg:={\"n\": {\"m\": [1]}}"),
            ("cfg".into(), json!({"n": {"m": [1]}}))
        );
        assert_eq!(ok("who:=\"@home\""), ("who".into(), json!("@home")));
    }

    #[test]
    fn scoped_keys_keep_their_prefix() {
        assert_eq!(ok("user:name=ada"), ("user:name".into(), json!("ada")));
        assert_eq!(ok("app:limit:=5"), ("app:limit".into(), json!(5)));
        assert_eq!(ok(" temp:k =v"), ("temp:k".into(), json!("v")));
    }

    #[test]
    fn at_reads_a_file_as_text_or_as_json() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v.json");
        std::fs::write(&path, "{\"rounds\": [1, 2]}\n").expect("write");
        let path = path.display();
        assert_eq!(
            ok(&format!("doc=@{path}")),
            ("doc".into(), json!("{\"rounds\": [1, 2]}\n"))
        );
        assert_eq!(
            ok(&format!("doc:=@{path}")),
            ("doc".into(), json!({"rounds": [1, 2]}))
        );
        let missing = err("doc:=@/no/such/file.json");
        assert!(
            missing.starts_with(
                "`--input doc:=@/no/such/file.json`: cannot read `/no/such/file.json`"
            ),
            "{missing}"
        );
    }

    #[test]
    fn bad_json_names_the_key_and_shows_the_forms() {
        insta::assert_snapshot!(err("rounds:=three"));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.json");
        std::fs::write(&path, "[1, 2").expect("write");
        let path = path.display();
        let message = err(&format!("list:=@{path}"));
        assert!(
            message.starts_with(&format!(
                "The value of `list` in `--input list:=@{path}` (the file `{path}`) is not JSON (EOF"
            )),
            "{message}"
        );
        assert!(message.ends_with(&format!("or pass it as text: `list=@{path}`")));
    }

    #[test]
    fn no_key_or_no_equals_is_refused_with_examples() {
        insta::assert_snapshot!(err("topic"));
        for input in ["=x", ":=3", " =y"] {
            let message = err(input);
            assert!(
                message.starts_with(&format!("`--input {input}` is not `KEY=VALUE`")),
                "{message}"
            );
        }
    }
}
