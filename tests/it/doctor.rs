//! `rlm doctor`: the confinement layers of this machine, and whether the workers' code goes on
//! huge pages here, as a table and as JSON.

use crate::support::{
    finish, rlm, rlm_command, transparent_huge_pages_here, without_transparent_huge_pages,
};

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

/// `rlm doctor` as started by `prepare`'d command, as a table and as JSON.
fn doctor_with(prepare: impl Fn(&mut std::process::Command)) -> (String, serde_json::Value) {
    let mut table = rlm_command(&["doctor".to_owned()]);
    prepare(&mut table);
    let table = finish(table, None);
    table.assert_code(0);
    let mut json = rlm_command(&["doctor".to_owned(), "--json".to_owned()]);
    prepare(&mut json);
    let json = finish(json, None);
    json.assert_code(0);
    (table.stdout, json.json())
}

/// The doctor says whether the workers' code goes on huge pages here, having tried each
/// window as the template does: all of them on this machine (where transparent huge pages
/// can be had; skipped, saying why, elsewhere except in CI).
#[test]
fn doctor_says_the_workers_code_goes_on_huge_pages_here() {
    if !transparent_huge_pages_here() {
        return;
    }
    let (table, doc) = doctor_with(|_| {});
    let huge = &doc["huge_code"];
    let windows = huge["windows"].as_u64().unwrap_or_default();
    // Two of `libpython`'s windows, and most of `rlm`'s ~23 MiB.
    assert!(windows >= 5, "{doc:#}");
    assert_eq!(huge["moved"], windows, "{doc:#}");
    assert_eq!(huge["page_size"], 2 << 20, "{doc:#}");
    assert!(
        huge["reason"].is_null() && huge["remedy"].is_null(),
        "{doc:#}"
    );
    // A run of its own: as the loader placed the code, maybe one window more or fewer.
    let said = table
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "Workers' code on huge pages (a worker idle through a model call wakes faster): ",
            )
        })
        .unwrap_or_else(|| panic!("no huge pages line:\n{table}"));
    let (counts, rest) = said.split_once(" windows of 2 MiB").unwrap_or_default();
    let counts: Vec<u64> = counts
        .split(" of ")
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[0].abs_diff(windows) <= 2,
        "{said}"
    );
    assert_eq!(
        rest,
        " (each tried here on a copy; as the loader places the code, a template may have one \
         more or fewer)"
    );
    assert!(!table.contains("to change it"), "{table}");
}

/// Started with transparent huge pages turned off for it (`PR_SET_THP_DISABLE`, which
/// children inherit, as from a service manager or a container runtime), the doctor says the
/// workers' code stays in the files' pages, why, and what to do; the layers are unchanged.
#[test]
fn doctor_says_why_the_workers_code_is_not_on_huge_pages_and_what_to_do() {
    let (table, doc) = doctor_with(without_transparent_huge_pages);
    let why = "transparent huge pages are off for this process (`PR_SET_THP_DISABLE`, \
               inherited from whatever started it)";
    let remedy = "start `rlm` from a process that has them";
    assert!(
        table.contains(&format!(
            "Workers' code on huge pages (a worker idle through a model call wakes faster): \
             none: {why}\n  to change it: {remedy}"
        )),
        "{table}"
    );
    assert_eq!(doc["huge_code"]["moved"], 0, "{doc:#}");
    assert_eq!(doc["huge_code"]["reason"], why, "{doc:#}");
    assert!(
        doc["huge_code"]["remedy"]
            .as_str()
            .is_some_and(|r| r.starts_with(remedy)),
        "{doc:#}"
    );
    assert_eq!(doc["fully_confined"], true, "{doc:#}");
}
