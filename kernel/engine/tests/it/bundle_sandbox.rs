//! The hostile-path suite: every path an agent's tools must refuse, each asserted refused
//! with a clear error, nothing outside read or written.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use engine::bundle::{DEFAULT_MAX_FILE_BYTES, StartedAgent};
use serde_json::{Value, json};

use crate::bundle_support::{DATE, copy_tree, ctx, fixtures, tool};

const AGENT: &str = "bmad/cis/agents/design-thinking-coach.md";
const SECRET: &str = "top secret";

/// A project (the hand-written fixture, output folder `docs/`) inside a folder that also
/// holds files the agent must never touch, with links and special files planted inside.
struct Hostile {
    outer: tempfile::TempDir,
}

impl Hostile {
    fn new() -> Self {
        let outer = tempfile::tempdir().expect("tempdir");
        let o = outer.path();
        copy_tree(&fixtures().join("v6-alpha0"), &o.join("proj"));
        std::fs::write(o.join("secret.txt"), SECRET).expect("succeeds");
        std::fs::write(
            o.join("secret.yaml"),
            "name: stolen\ninstructions: secret.txt\n",
        )
        .expect("succeeds");
        std::fs::create_dir(o.join("proj-evil")).expect("succeeds");
        std::fs::write(o.join("proj-evil/secret.txt"), SECRET).expect("succeeds");
        let p = o.join("proj");
        let docs = p.join("docs");
        std::fs::create_dir(&docs).expect("succeeds");
        symlink(o.join("secret.txt"), p.join("link-to-secret")).expect("succeeds");
        symlink(o, p.join("link-dir")).expect("succeeds");
        symlink(p.join("chain2"), p.join("chain1")).expect("succeeds");
        symlink(o.join("secret.txt"), p.join("chain2")).expect("succeeds");
        symlink("../secret.txt", p.join("rel-link")).expect("succeeds");
        symlink("/dev/zero", p.join("zero")).expect("succeeds");
        symlink(p.join("loop-b"), p.join("loop-a")).expect("succeeds");
        symlink(p.join("loop-a"), p.join("loop-b")).expect("succeeds");
        symlink(o.join("nothing-here.txt"), p.join("dangling")).expect("succeeds");
        mkfifo(&p.join("pipe"));
        mkfifo(&docs.join("pipe"));
        std::fs::write(
            p.join("big.txt"),
            vec![b'a'; DEFAULT_MAX_FILE_BYTES as usize + 1],
        )
        .expect("succeeds");
        std::fs::write(p.join("binary.bin"), [0xff, 0xfe, 0x00, 0x80]).expect("succeeds");
        symlink(o, docs.join("link-out")).expect("succeeds");
        symlink(o.join("secret.txt"), docs.join("file-link.md")).expect("succeeds");
        symlink(o.join("planted.md"), docs.join("dangling.md")).expect("succeeds");
        Self { outer }
    }

    fn project(&self) -> PathBuf {
        std::fs::canonicalize(self.outer.path().join("proj")).expect("succeeds")
    }

    fn start(&self) -> StartedAgent {
        let options = engine::bundle::StartOptions {
            project_root: Some(self.project()),
            date: Some(DATE.to_owned()),
            ..Default::default()
        };
        StartedAgent::start(&self.project().join(AGENT), &options).expect("agent starts")
    }

    /// Every file directly in the outer folder with its content.
    fn outside_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(self.outer.path())
            .expect("succeeds")
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).expect("succeeds"),
                )
            })
            .collect();
        files.sort();
        files
    }
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("succeeds");
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// (tool, arguments, what the error must say).
fn hostile_calls() -> Vec<(&'static str, Value, &'static str)> {
    let outside = "is outside the folders this agent may read";
    let outside_write = "is outside the folders this agent may write to";
    let big = "x".repeat(DEFAULT_MAX_FILE_BYTES as usize + 1);
    let tmp = std::env::temp_dir().join(format!("rlm-hostile-{}.md", std::process::id()));
    vec![
        // Reads: `..` escapes.
        ("read_file", json!({"path": "../secret.txt"}), outside),
        (
            "read_file",
            json!({"path": "../../../../../../../../etc/passwd"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{project-root}/../secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{bundle-root}/../../../secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{core-root}/../../../secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{project-root}/bmad/./../../secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{output_folder}/../../secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{project-root}/../proj-evil/secret.txt"}),
            outside,
        ),
        // Reads: absolute paths elsewhere.
        ("read_file", json!({"path": "/etc/passwd"}), outside),
        ("read_file", json!({"path": "/proc/self/environ"}), outside),
        (
            "read_file",
            json!({"path": "/proc/self/root/etc/passwd"}),
            outside,
        ),
        ("read_file", json!({"path": "/dev/null"}), outside),
        // Reads: symbolic links pointing out.
        (
            "read_file",
            json!({"path": "{project-root}/link-to-secret"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{project-root}/link-dir/secret.txt"}),
            outside,
        ),
        (
            "read_file",
            json!({"path": "{project-root}/chain1"}),
            outside,
        ),
        ("read_file", json!({"path": "rel-link"}), outside),
        ("read_file", json!({"path": "{project-root}/zero"}), outside),
        (
            "read_file",
            json!({"path": "{project-root}/loop-a"}),
            "symbolic links",
        ),
        (
            "read_file",
            json!({"path": "{project-root}/dangling"}),
            "is a symbolic link to nothing",
        ),
        // Reads: NUL bytes, special files, size, encoding, nothing.
        (
            "read_file",
            json!({"path": "bmad/cis/config.yaml\u{0}.png"}),
            "NUL byte",
        ),
        (
            "read_file",
            json!({"path": "{project-root}/pipe"}),
            "is a named pipe",
        ),
        (
            "read_file",
            json!({"path": "{project-root}/bmad"}),
            "is a directory",
        ),
        (
            "read_file",
            json!({"path": "{project-root}/big.txt"}),
            "over the limit of 2097152 bytes",
        ),
        (
            "read_file",
            json!({"path": "{project-root}/binary.bin"}),
            "is not UTF-8 text",
        ),
        ("read_file", json!({"path": "  "}), "The path is empty"),
        (
            "read_file",
            json!({"path": "{secret_root}/x"}),
            "Unknown variable `{secret_root}`",
        ),
        // Workflows and their data files are read through the same sandbox.
        (
            "execute_workflow",
            json!({"path": "{project-root}/../secret.yaml"}),
            outside,
        ),
        ("execute_workflow", json!({"path": "/etc/passwd"}), outside),
        (
            "execute_workflow",
            json!({"path": "{project-root}/bmad/cis/workflows/design-thinking/workflow.yaml", "data": "../secret.txt"}),
            outside,
        ),
        // Writes: outside the output folder, even inside the project.
        (
            "save_output",
            json!({"path": "../escape.md", "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": "{project-root}/bmad/cis/config.yaml", "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": tmp, "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": "{output_folder}/new/../../../escape.md", "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": "/dev/null", "content": "x"}),
            outside_write,
        ),
        // Writes: links out of the output folder.
        (
            "save_output",
            json!({"path": "{output_folder}/link-out/planted.md", "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": "{output_folder}/file-link.md", "content": "x"}),
            outside_write,
        ),
        (
            "save_output",
            json!({"path": "{output_folder}/dangling.md", "content": "x"}),
            "is a symbolic link to nothing",
        ),
        // Writes: NUL bytes, special files, size.
        (
            "save_output",
            json!({"path": "{output_folder}/x\u{0}.md", "content": "x"}),
            "NUL byte",
        ),
        (
            "save_output",
            json!({"path": "{output_folder}/pipe", "content": "x"}),
            "is a named pipe",
        ),
        (
            "save_output",
            json!({"path": "{output_folder}", "content": "x"}),
            "is a directory",
        ),
        (
            "save_output",
            json!({"path": "{output_folder}/big.md", "content": big}),
            "over the limit of 2097152 bytes",
        ),
    ]
}

#[tokio::test]
async fn every_hostile_path_is_refused_and_nothing_outside_is_touched() {
    let hostile = Hostile::new();
    let agent = hostile.start();
    let before = hostile.outside_files();
    let log_before = agent.session.file_log().len();
    let calls = hostile_calls();
    assert!(calls.len() >= 30, "the suite has {} paths", calls.len());
    for (name, args, expected) in calls {
        let shown = args["path"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(80)
            .collect::<String>();
        let result = tool(&agent, name).call(args.clone(), &ctx()).await;
        let err = match result {
            Ok(value) => panic!("{name} {shown:?} was not refused: {value}"),
            Err(err) => err.to_string(),
        };
        assert!(
            err.contains(expected),
            "{name} {shown:?}\n  got: {err}\n want: {expected}"
        );
        assert!(
            err.starts_with(|c: char| c.is_uppercase() || c == '`'),
            "{err}"
        );
    }
    assert_eq!(hostile.outside_files(), before, "nothing outside changed");
    assert!(!hostile.outer.path().join("planted.md").exists());
    assert!(!hostile.outer.path().join("escape.md").exists());
    assert!(
        !std::env::temp_dir()
            .join(format!("rlm-hostile-{}.md", std::process::id()))
            .exists()
    );
    let project = hostile.project();
    let after = agent.session.file_log().entries();
    // The one workflow read is the real one whose data file was then refused.
    for access in &after[log_before..] {
        assert!(access.path.starts_with(&project), "{access:?}");
    }
    assert_eq!(
        std::fs::read_to_string(project.join("bmad/cis/config.yaml")).expect("succeeds"),
        std::fs::read_to_string(fixtures().join("v6-alpha0/bmad/cis/config.yaml"))
            .expect("succeeds")
    );
}

#[tokio::test]
async fn a_link_inside_the_allowed_folders_is_followed() {
    let hostile = Hostile::new();
    let project = hostile.project();
    symlink(
        project.join("bmad/cis/config.yaml"),
        project.join("config-link"),
    )
    .expect("succeeds");
    let agent = hostile.start();
    let read = tool(&agent, "read_file")
        .call(json!({"path": "config-link"}), &ctx())
        .await
        .expect("a link to a file inside is fine");
    assert_eq!(read["path"], json!(project.join("bmad/cis/config.yaml")));
}
