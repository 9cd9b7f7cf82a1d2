//! What the confined process may do: the paths it reads, executes and writes, whether it has
//! a network, its resource limits and its environment.
//!
//! A [`Policy`] is plain data (serialisable, so a parent can hand it to the worker it
//! spawns). [`Policy::new`] starts from what any program on this machine needs — the system
//! libraries and tools, a few files of `/etc`, `/dev/null` — with one writable scratch
//! directory; the caller adds the Python installation and the context files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Directories every confined program may read and execute from: the system's libraries,
/// tools and shared data. Paths missing here are skipped.
pub const SYSTEM_EXEC_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Files and folders outside the system directories that programs read at start-up
/// (dynamic loader cache, time zone, user and group names, locale, Python's Debian
/// configuration) and read-only views of this process and the CPUs. Nothing here holds a
/// secret: `/etc` as a whole is not readable (it has `shadow`, keys and credentials). Where
/// the confined process has a `/proc` of its PID namespace's own, it reads that whole
/// instead: its own processes' folders, and none of the machine-wide files listed here.
pub const SYSTEM_READ_PATHS: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/gai.conf",
    "/etc/mime.types",
    "/etc/locale.alias",
    "/etc/locale.conf",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/alternatives",
    "/etc/fonts",
    "/etc/matplotlibrc",
    "/etc/python3",
    "/etc/python3.9",
    "/etc/python3.10",
    "/etc/python3.11",
    "/etc/python3.12",
    "/etc/python3.13",
    "/etc/python3.14",
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/sys/devices/system/cpu",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Files every confined program may write besides its scratch directory.
pub const SYSTEM_WRITE_FILES: &[&str] = &["/dev/null"];

/// How hard [`enter`](crate::enter) insists on its layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Level {
    /// Apply every layer this kernel supports and report the others (`--isolation process`).
    #[default]
    BestEffort,
    /// Refuse to run unless every layer is in force (`--isolation strict`).
    Strict,
}

/// Resource limits of the confined process; `None` leaves the inherited limit alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Writable private memory of each process (`RLIMIT_DATA`): heap, anonymous mappings,
    /// thread stacks. Read-only file mappings (a memory-mapped context) do not count.
    pub memory_bytes: Option<u64>,
    /// CPU seconds over the process's life (`RLIMIT_CPU`; `SIGXCPU`, then `SIGKILL` 5 s later).
    pub cpu_seconds: Option<u64>,
    /// Largest file the process may write (`RLIMIT_FSIZE`; a larger write fails with `EFBIG`).
    pub file_size_bytes: Option<u64>,
    /// Processes and threads the confined tree may hold at once.
    pub processes: Option<u64>,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: Some(default_memory_limit()),
            cpu_seconds: Some(DEFAULT_CPU_SECONDS),
            file_size_bytes: Some(DEFAULT_FILE_SIZE_BYTES),
            processes: Some(DEFAULT_PROCESSES),
            open_files: Some(DEFAULT_OPEN_FILES),
        }
    }
}

impl Limits {
    /// The defaults for a scratch dir on `scratch`'s file system: as [`Limits::default`],
    /// with the largest file also at most a quarter of the space free there, so that one
    /// runaway write cannot fill the user's disk.
    pub fn for_scratch(scratch: &Path) -> Self {
        let mut limits = Self::default();
        if let (Some(free), Some(max)) = (free_space(scratch), limits.file_size_bytes) {
            limits.file_size_bytes = Some(max.min(free / 4).max(MIN_FILE_SIZE_BYTES));
        }
        limits
    }
}

/// The smallest default file size limit, however full the disk: 64 MiB.
const MIN_FILE_SIZE_BYTES: u64 = 64 << 20;

/// Bytes free to an unprivileged user on the file system of `path` (or of its nearest
/// existing ancestor).
#[cfg(target_os = "linux")]
fn free_space(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(not(target_os = "linux"))]
fn free_space(_path: &Path) -> Option<u64> {
    None
}

/// Default CPU time of one worker over its whole life: two hours.
pub const DEFAULT_CPU_SECONDS: u64 = 2 * 60 * 60;
/// Default largest file: 8 GiB (less on a fuller disk: see [`Limits::for_scratch`]).
pub const DEFAULT_FILE_SIZE_BYTES: u64 = 8 << 30;
/// Default processes and threads of the confined tree.
pub const DEFAULT_PROCESSES: u64 = 256;
/// Default open file descriptors per process.
pub const DEFAULT_OPEN_FILES: u64 = 4096;

/// The default memory limit: half of this machine's physical memory (at least 1 GiB), so
/// that a memory bomb in model code fails with `MemoryError` long before the machine swaps
/// or the OOM killer picks a process of the user's.
pub fn default_memory_limit() -> u64 {
    (physical_memory().unwrap_or(8 << 30) / 2).max(1 << 30)
}

#[cfg(target_os = "linux")]
fn physical_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(not(target_os = "linux"))]
fn physical_memory() -> Option<u64> {
    None
}

/// Environment variables carried from the caller's environment into the confined one when
/// set: locale and time zone only (never keys, tokens or proxies).
pub const INHERITED_ENV: &[&str] = &[
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "TZ",
];

/// The search path of the confined process.
pub const CONFINED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What the confined process may do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Files and folders it may read (folders: everything beneath).
    pub read_paths: Vec<PathBuf>,
    /// Files and folders it may read and execute.
    pub exec_paths: Vec<PathBuf>,
    /// Files and folders it may read, write, create in and delete from: the scratch
    /// directory (first) and [`SYSTEM_WRITE_FILES`].
    pub write_paths: Vec<PathBuf>,
    /// Whether it may use the network. `false` (the default): no network namespace link,
    /// no IP sockets, no `connect` or `bind`.
    pub network: bool,
    /// Its resource limits.
    pub limits: Limits,
    /// Its whole environment: every other variable is removed.
    pub env: BTreeMap<String, String>,
}

impl Policy {
    /// The policy for a worker whose only writable place is `scratch`: the system paths
    /// above, no network, [`Limits::for_scratch`], and an environment of `PATH`, `HOME`, `TMPDIR` and
    /// `SCRATCH` (all three the scratch directory) plus the caller's locale and time zone.
    pub fn new(scratch: impl Into<PathBuf>) -> Self {
        let scratch = scratch.into();
        let mut env = BTreeMap::new();
        for name in INHERITED_ENV {
            if let Ok(value) = std::env::var(name) {
                env.insert((*name).to_owned(), value);
            }
        }
        env.insert("PATH".into(), CONFINED_PATH.into());
        let dir = scratch.to_string_lossy().into_owned();
        for name in ["HOME", "TMPDIR", "SCRATCH"] {
            env.insert(name.into(), dir.clone());
        }
        let scratch_dir = scratch.clone();
        let mut write_paths = vec![scratch];
        write_paths.extend(SYSTEM_WRITE_FILES.iter().map(PathBuf::from));
        Self {
            read_paths: SYSTEM_READ_PATHS.iter().map(PathBuf::from).collect(),
            exec_paths: SYSTEM_EXEC_PATHS.iter().map(PathBuf::from).collect(),
            write_paths,
            network: false,
            limits: Limits::for_scratch(&scratch_dir),
            env,
        }
    }

    /// Adds a file or folder the process may read (a context file, a data folder).
    pub fn allow_read(mut self, path: impl Into<PathBuf>) -> Self {
        self.read_paths.push(path.into());
        self
    }

    /// Adds a file or folder the process may read and execute (a Python installation).
    pub fn allow_exec(mut self, path: impl Into<PathBuf>) -> Self {
        self.exec_paths.push(path.into());
        self
    }

    /// Sets one variable of the confined environment.
    pub fn set_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// The scratch directory: the first writable path.
    pub fn scratch(&self) -> Option<&Path> {
        self.write_paths.first().map(PathBuf::as_path)
    }
}
