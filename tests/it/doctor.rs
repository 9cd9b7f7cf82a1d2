//! `rlm doctor`: the confinement layers of this machine, as a table and as JSON.

use crate::support::rlm;

const LAYERS: [&str; 7] = [
    "filesystem",
    "network",
    "syscalls",
    "limits",
    "processes",
    "lifetime",
    "environment",
];

#[test]
fn doctor_lists_every_layer_and_this_machine_confines_them_all() {
    let run = rlm(&["doctor".to_owned()], None);
    run.assert_code(0);
    for layer in LAYERS {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(layer))
            .unwrap_or_else(|| panic!("no `{layer}` line:\n{}", run.stdout));
        assert!(
            line.contains(" active "),
            "`{layer}` is not active here:\n{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("Landlock ABI"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("All 7 layers can be put in force here."),
        "{}",
        run.stdout
    );
}

#[test]
fn doctor_json_gives_each_layer_its_state_and_detail() {
    let run = rlm(&["doctor".to_owned(), "--json".to_owned()], None);
    run.assert_code(0);
    let doc = run.json();
    assert_eq!(doc["fully_confined"], true, "{doc:#}");
    let layers = doc["layers"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = layers.iter().filter_map(|l| l["layer"].as_str()).collect();
    assert_eq!(names, LAYERS);
    for layer in &layers {
        assert_eq!(layer["state"], "active", "{layer:#}");
        assert!(
            layer["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{layer:#}"
        );
    }
}
