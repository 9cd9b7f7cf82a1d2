//! Files a run writes never destroy files it reads.
//!
//! Before anything loads, every output path (`--answer-file`, `--trajectory`) is compared with
//! every input (the contexts, files inside context directories, `rlm.toml`, the prompt files)
//! by device and inode, so `./x`, `dir/../x`, hard links and symlinks all count as the same
//! file. A clash is a usage error (exit 2) and touches nothing.
//!
//! The answer file is never truncated up front: [`check_answer_file`] proves the folder is
//! writable with a throwaway temporary file, and [`write_answer_file`] writes the answer to a
//! temporary file beside the target and renames it into place, so a run that fails or is
//! killed leaves the previous file as it was. An existing trajectory is only replaced with
//! `--force`.

use std::fs::{File, OpenOptions, Permissions};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::exit::UsageError;

/// An output path and the flag that named it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output<'a> {
    pub(crate) flag: &'static str,
    pub(crate) path: &'a Path,
}

/// The identity of an existing file: (device, inode).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuses outputs that are the same file as an input or as each other, and an existing,
/// non-empty trajectory unless `force`.
pub(crate) fn check_outputs(inputs: &[PathBuf], outputs: &[Output<'_>], force: bool) -> Result<()> {
    for (i, out) in outputs.iter().enumerate() {
        let Some(id) = file_id(out.path) else {
            continue;
        };
        for input in inputs {
            if file_id(input) == Some(id) {
                return Err(UsageError::new(format!(
                    "`--{}` `{}` is the input file `{}`; writing it would destroy the input. Choose another path",
                    out.flag,
                    out.path.display(),
                    input.display()
                ))
                .into());
            }
            if input.is_dir() && contains(input, out.path) {
                return Err(UsageError::new(format!(
                    "`--{}` `{}` is a file inside the context directory `{}`; writing it would change the input. Choose a path outside that directory",
                    out.flag,
                    out.path.display(),
                    input.display()
                ))
                .into());
            }
        }
        if let Some(other) = outputs[..i].iter().find(|o| file_id(o.path) == Some(id)) {
            return Err(UsageError::new(format!(
                "`--{}` and `--{}` name the same file `{}`; give each its own path",
                other.flag,
                out.flag,
                out.path.display()
            ))
            .into());
        }
    }
    // Two outputs that do not exist yet can still be the same path.
    for (i, out) in outputs.iter().enumerate() {
        let canonical = canonical_target(out.path);
        if let Some(other) = outputs[..i]
            .iter()
            .find(|o| canonical_target(o.path) == canonical)
        {
            return Err(UsageError::new(format!(
                "`--{}` and `--{}` name the same file `{}`; give each its own path",
                other.flag,
                out.flag,
                out.path.display()
            ))
            .into());
        }
        if out.flag == "trajectory"
            && !force
            && std::fs::metadata(out.path).is_ok_and(|m| m.len() > 0)
        {
            return Err(UsageError::new(format!(
                "The trajectory file `{}` already exists; pass `--force` to overwrite it, or choose another path",
                out.path.display()
            ))
            .into());
        }
    }
    Ok(())
}

/// Whether `dir` (canonicalised) contains the existing file `path`.
fn contains(dir: &Path, path: &Path) -> bool {
    match (dir.canonicalize(), path.canonicalize()) {
        (Ok(dir), Ok(path)) => path.starts_with(dir),
        _ => false,
    }
}

/// The path a write to `path` lands on: symlinks followed; for a file that does not exist
/// yet, its canonical folder joined with its name.
fn canonical_target(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let folder = parent_folder(path);
    let folder = folder.canonicalize().unwrap_or(folder);
    match path.file_name() {
        Some(name) => folder.join(name),
        None => folder,
    }
}

fn parent_folder(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks, without touching an existing answer file, that the answer can be written to
/// `path` at the end: its folder takes a new file, and an existing file is writable.
pub(crate) fn check_answer_file(path: &Path) -> Result<()> {
    let target = canonical_target(path);
    let folder = parent_folder(&target);
    tempfile::NamedTempFile::new_in(&folder).with_context(|| {
        format!(
            "Could not write the answer file `{}`: its folder `{}` does not take new files",
            path.display(),
            folder.display()
        )
    })?;
    if target.exists() {
        OpenOptions::new()
            .write(true)
            .open(&target)
            .with_context(|| format!("Could not write the answer file `{}`", path.display()))?;
    }
    Ok(())
}

/// Writes `text` to `path` atomically: a temporary file in the same folder, renamed over the
/// target (a symlink's target is replaced, not the link). A new file gets mode 0644; an
/// existing one keeps its mode.
pub(crate) fn write_answer_file(path: &Path, text: &str) -> Result<()> {
    let target = canonical_target(path);
    let folder = parent_folder(&target);
    let mode = std::fs::metadata(&target).map_or(0o644, |m| m.mode() & 0o7777);
    let write = || -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".rlm-answer-")
            .permissions(Permissions::from_mode(mode))
            .tempfile_in(&folder)?;
        tmp.write_all(text.as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&target).map_err(|e| e.error)?;
        Ok(())
    };
    write().with_context(|| format!("Could not write the answer file `{}`", path.display()))?;
    // Make the rename itself durable.
    if let Ok(dir) = File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(inputs: &[PathBuf], outputs: &[Output<'_>]) -> String {
        match check_outputs(inputs, outputs, false) {
            Ok(()) => panic!("expected a refusal"),
            Err(e) => {
                assert!(
                    e.downcast_ref::<UsageError>().is_some(),
                    "a usage error: {e}"
                );
                e.to_string()
            }
        }
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_however_it_is_spelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("ctx.txt");
        std::fs::write(&input, "data").expect("write");
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink(&input, &link).expect("symlink");
        let hard = dir.path().join("hard.txt");
        std::fs::hard_link(&input, &hard).expect("hard link");
        let dotted = dir.path().join(".").join("sub/../ctx.txt");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        for out in [&input, &link, &hard, &dotted] {
            let msg = refused(
                std::slice::from_ref(&input),
                &[Output {
                    flag: "answer-file",
                    path: out,
                }],
            );
            assert!(msg.contains("`--answer-file`"), "{msg}");
        }
        assert_eq!(std::fs::read_to_string(&input).expect("read"), "data");
    }

    #[test]
    fn an_output_inside_a_context_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a.txt");
        std::fs::write(&file, "a").expect("write");
        let msg = refused(
            &[dir.path().to_path_buf()],
            &[Output {
                flag: "trajectory",
                path: &file,
            }],
        );
        assert!(msg.contains("inside the context directory"), "{msg}");
    }

    #[test]
    fn two_outputs_on_one_path_are_refused_even_before_they_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("out.txt");
        let b = dir.path().join("./out.txt");
        let msg = refused(
            &[],
            &[
                Output {
                    flag: "answer-file",
                    path: &a,
                },
                Output {
                    flag: "trajectory",
                    path: &b,
                },
            ],
        );
        assert!(msg.contains("name the same file"), "{msg}");
    }

    #[test]
    fn an_existing_trajectory_needs_force() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("t.jsonl");
        std::fs::write(&t, "{}\n").expect("write");
        let out = [Output {
            flag: "trajectory",
            path: &t,
        }];
        assert!(refused(&[], &out).contains("--force"));
        check_outputs(&[], &out, true).expect("--force allows it");
    }

    #[test]
    fn the_answer_file_is_replaced_whole_and_keeps_its_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("answer.txt");
        std::fs::write(&path, "old answer, longer than the new one").expect("write");
        std::fs::set_permissions(&path, Permissions::from_mode(0o640)).expect("chmod");
        check_answer_file(&path).expect("writable");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "old answer, longer than the new one",
            "the check must not truncate"
        );
        write_answer_file(&path, "42").expect("written");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "42");
        let mode = std::fs::metadata(&path).expect("meta").mode() & 0o777;
        assert_eq!(mode, 0o640);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".rlm-answer-"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary file is left behind");
    }

    #[test]
    fn an_answer_file_in_a_missing_folder_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing/answer.txt");
        let err = check_answer_file(&path).expect_err("missing folder");
        assert!(err.to_string().contains("answer file"), "{err}");
        assert!(!path.exists());
    }
}
