//! A throwaway PostgreSQL server for tests and benchmarks: a real server, started on first
//! use, shared by every test of the run, gone when the run ends.
//!
//! [`server`] gives the server of this test run. The first caller starts it: `initdb` into a
//! fresh folder under the temporary directory (a superuser `rlm_test` with a random password,
//! password authentication over TCP), then `pg_ctl start` on a free port of 127.0.0.1 (no
//! Unix socket, no other address). Each test takes a database of its own
//! ([`Server::database`]), dropped when the test is done, so tests that run at once never see
//! each other's rows.
//!
//! # One server per test run, stopped when the run ends
//!
//! `cargo nextest` runs every test in a process of its own, so a server per process would
//! cost an `initdb` per test. The server belongs to the run instead: its folder is named after
//! the run (`NEXTEST_RUN_ID`; under `cargo test` or a benchmark, which run in one process, the
//! process id), and the first process of the run starts it under a file lock while the others
//! wait for the lock and join it.
//!
//! What stops it is a guardian: a small `sh` loop, started in a process group of its own
//! *before* the server, that waits until the run's process is gone — nextest's runner (the
//! parent of every test process) or the one test process — then stops the server
//! (`pg_ctl stop`) and deletes the folder. So a test that panics, aborts or is killed leaves
//! the server to the guardian, and Ctrl-C in a terminal (which signals the foreground process
//! group) stops the run first and the server a second later. A folder whose guardian was
//! itself killed is swept by the next start. Every wait is bounded: `initdb` and `pg_ctl` by
//! timeouts, `psql` by a connect and a run timeout, the lock by a deadline, and the guardian
//! by a lifetime of [`MAX_LIFETIME`].
//!
//! # Root
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does), `initdb`,
//! `pg_ctl` and the server run as the `postgres` user (`runuser -u postgres --`) in a folder
//! that user owns; the tests themselves stay root and only connect.
//!
//! # Finding PostgreSQL
//!
//! The binaries (`initdb`, `pg_ctl`, `postgres`, `psql`, `pg_isready`) are taken from the
//! folder `RLM_PG_BIN` names, else the newest `/usr/lib/postgresql/N/bin` (Debian and Ubuntu
//! install them there, off `PATH`), else `PATH`, else `pg_config --bindir`. When they are
//! missing, [`server`] panics saying what to install: a test that needs PostgreSQL fails, it
//! is never skipped.
//!
//! The server is made for tests: `fsync` and `synchronous_commit` are off (the server's
//! process is never the one a test kills, and the machine does not crash mid-test), which
//! also makes a commit cost about what SQLite's `synchronous = NORMAL` in WAL mode does.
//!
//! ```no_run
//! let server = test_postgres::server();
//! let db = server.database();
//! assert_eq!(server.psql(db.name(), "SELECT 1 + 1"), "2");
//! println!("connect to {}", db.url());
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The superuser the tests connect as.
pub const ADMIN: &str = "rlm_test";

/// The longest a server lives, whatever happens to the run (CI gives a run 90 minutes).
pub const MAX_LIFETIME: Duration = Duration::from_secs(3 * 60 * 60);

/// The longest `initdb` or `pg_ctl start` may take.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest one `psql` command may take.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest a process waits for another one of its run to finish starting the server.
const LOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// The OS user that runs PostgreSQL when the tests run as root.
const SERVER_USER: &str = "postgres";

/// The guardian: waits until the watched process is gone (or the lifetime is over, or the
/// folder was removed), then stops the server and deletes its folder.
/// Arguments: watched pid, lifetime in seconds, folder, binaries folder, user ("" = this one).
const GUARDIAN: &str = r#"
watched=$1; lifetime=$2; dir=$3; bin=$4; user=$5
as_server() { if [ -n "$user" ]; then runuser -u "$user" -- "$@"; else "$@"; fi; }
end=$(( $(date +%s) + lifetime ))
while kill -0 "$watched" 2>/dev/null && [ "$(date +%s)" -lt "$end" ] && [ -d "$dir" ]; do
    sleep 1
done
if [ -f "$dir/data/postmaster.pid" ]; then
    as_server "$bin/pg_ctl" stop -D "$dir/data" -m fast -w -t 30 >/dev/null 2>&1 ||
        as_server "$bin/pg_ctl" stop -D "$dir/data" -m immediate -w -t 30 >/dev/null 2>&1
fi
rm -rf "$dir"
"#;

/// The running server of this test run.
#[derive(Debug)]
pub struct Server {
    bin: PathBuf,
    port: u16,
    password: String,
}

/// A database of its own for one test, dropped with it.
#[derive(Debug)]
pub struct Database {
    server: &'static Server,
    name: String,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The server of this test run, started if no process of the run has started it yet; see
/// the crate docs. Panics with what to do when PostgreSQL is missing or does not start.
pub fn server() -> &'static Server {
    match SERVER.get_or_init(start_or_join) {
        Ok(server) => server,
        Err(why) => panic!("{why}"),
    }
}

impl Server {
    /// The port it listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of [`ADMIN`].
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The folder of the PostgreSQL binaries in use.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// A `postgres://` URL of database `name` as [`ADMIN`], with the password.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{ADMIN}:{}@127.0.0.1:{}/{name}",
            self.password, self.port
        )
    }

    /// A new empty database, dropped (with whatever still connects to it) when the returned
    /// value is.
    pub fn database(&'static self) -> Database {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}_{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed),
            random_text(6).to_ascii_lowercase()
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        Database { server: self, name }
    }

    /// Runs `sql` in database `name` as [`ADMIN`] with `psql` and gives its output (unaligned,
    /// tuples only, trimmed). Panics with `psql`'s error when it fails.
    pub fn psql(&self, name: &str, sql: &str) -> String {
        match self.try_psql(name, sql) {
            Ok(out) => out,
            Err(why) => panic!("{why}"),
        }
    }

    /// [`psql`](Self::psql), with its failure as the error.
    pub fn try_psql(&self, name: &str, sql: &str) -> Result<String, String> {
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                ADMIN,
                "-d",
                name,
                "-c",
                sql,
            ])
            .env("PGPASSWORD", &self.password)
            .env("PGCONNECT_TIMEOUT", "10");
        let out = run_bounded(&mut command, PSQL_TIMEOUT)
            .map_err(|why| format!("`psql -c {sql:?}` on database `{name}`: {why}"))?;
        Ok(out.trim().to_owned())
    }
}

impl Database {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its `postgres://` URL as [`ADMIN`], with the password.
    pub fn url(&self) -> String {
        self.server.url(&self.name)
    }

    /// The server it is on.
    pub fn server(&self) -> &'static Server {
        self.server
    }

    /// Runs `sql` in it; see [`Server::psql`].
    pub fn psql(&self, sql: &str) -> String {
        self.server.psql(&self.name, sql)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // Best effort: a database left behind goes with the server at the end of the run.
        let _ = self.server.try_psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Joins the server of this run, or starts it.
fn start_or_join() -> Result<Server, String> {
    let bin = find_binaries()?;
    // Under nextest every test is a process of the runner; otherwise this process is the run.
    let (key, watched) = match std::env::var("NEXTEST_RUN_ID") {
        Ok(run) if !run.is_empty() => (format!("run-{run}"), std::os::unix::process::parent_id()),
        _ => (format!("pid-{}", std::process::id()), std::process::id()),
    };
    let user = server_user()?;
    let root = std::env::temp_dir().join("rlm-test-postgres");
    fs::create_dir_all(&root).map_err(|e| format!("Could not create `{}`: {e}", root.display()))?;
    // The server's user must reach its folder through this one.
    let _ = fs::set_permissions(&root, fs::Permissions::from_mode(0o755));
    let dir = root.join(&key);
    fs::create_dir_all(&dir).map_err(|e| format!("Could not create `{}`: {e}", dir.display()))?;
    let lock = lock(&dir)?;
    if let Some(server) = join(&dir, &bin) {
        return Ok(server);
    }
    sweep(&root, &dir, &bin, user.as_ref());
    let server = start(&dir, &bin, user.as_ref(), watched);
    drop(lock);
    server
}

/// The OS user that runs the server: `postgres` when this process is root, else this one.
fn server_user() -> Result<Option<User>, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, SERVER_USER])
            .output()
            .map_err(|e| format!("Could not run `id`: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                format!(
                    "The tests run as root, and PostgreSQL refuses to run as root, but there is \
                     no `{SERVER_USER}` user to run it as; create one (`useradd --system \
                     {SERVER_USER}`) or run the tests as another user"
                )
            })
    };
    Ok(Some(User {
        uid: id("-u")?,
        gid: id("-g")?,
    }))
}

/// The server's OS user when it is not this process's.
#[derive(Debug, Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

/// `command` as the server's user.
fn as_server(user: Option<&User>, program: &Path) -> Command {
    match user {
        Some(_) => {
            let mut command = Command::new("runuser");
            command.args(["-u", SERVER_USER, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Gives `path` to the server's user (when this process is root).
fn give(path: &Path, user: Option<&User>) -> Result<(), String> {
    match user {
        Some(user) => std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).map_err(|e| {
            format!(
                "Could not give `{}` to `{SERVER_USER}`: {e}",
                path.display()
            )
        }),
        None => Ok(()),
    }
}

/// The folder holding `initdb`, `pg_ctl`, `postgres`, `psql` and `pg_isready`.
fn find_binaries() -> Result<PathBuf, String> {
    const NEEDED: [&str; 5] = ["initdb", "pg_ctl", "postgres", "psql", "pg_isready"];
    let complete = |dir: &Path| NEEDED.iter().all(|name| dir.join(name).is_file());
    if let Some(dir) = std::env::var_os("RLM_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "`RLM_PG_BIN` is `{}`, which does not hold all of {}",
                dir.display(),
                NEEDED.join(", ")
            ))
        };
    }
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versioned.sort();
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|dir| dir.join("initdb").is_file())
        // /usr/local/bin/initdb may be a link into the real folder, which holds the rest.
        .filter_map(|dir| fs::canonicalize(dir.join("initdb")).ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf));
    let pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    versioned
        .into_iter()
        .rev()
        .map(|(_, dir)| dir)
        .chain(on_path)
        .chain(pg_config)
        .find(|dir| complete(dir))
        .ok_or_else(|| {
            format!(
                "The PostgreSQL server binaries ({}) were not found in `RLM_PG_BIN`, \
                 /usr/lib/postgresql/N/bin, `PATH` or `pg_config --bindir`; these tests need a \
                 real PostgreSQL server: install it (Debian/Ubuntu: `apt-get install \
                 postgresql`) or set `RLM_PG_BIN` to the folder of its binaries",
                NEEDED.join(", ")
            )
        })
}

/// Takes the run's start lock (bounded: another process starts the server meanwhile).
fn lock(dir: &Path) -> Result<File, String> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("Could not open `{}`: {e}", path.display()))?;
    let deadline = Instant::now() + LOCK_TIMEOUT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(format!(
                    "Could not lock `{}` (another test process of this run starting the \
                     server for over {} s?): {e}",
                    path.display(),
                    LOCK_TIMEOUT.as_secs()
                ));
            }
        }
    }
}

/// The server another process of this run started, if it still runs.
fn join(dir: &Path, bin: &Path) -> Option<Server> {
    let port: u16 = fs::read_to_string(dir.join("ready"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let password = fs::read_to_string(dir.join("password")).ok()?;
    let guardian: i32 = fs::read_to_string(dir.join("guardian.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !alive(guardian) || !ready(bin, port) {
        return None;
    }
    Some(Server {
        bin: bin.to_path_buf(),
        port,
        password: password.trim().to_owned(),
    })
}

/// Initialises and starts the server in `dir`, its guardian watching `watched`.
fn start(dir: &Path, bin: &Path, user: Option<&User>, watched: u32) -> Result<Server, String> {
    // Whatever a failed start of this run left.
    for name in ["ready", "guardian.pid"] {
        let _ = fs::remove_file(dir.join(name));
    }
    let data = dir.join("data");
    if data.exists() {
        stop(bin, &data, user);
        fs::remove_dir_all(&data)
            .map_err(|e| format!("Could not remove `{}`: {e}", data.display()))?;
    }
    give(dir, user)?;
    let password = random_text(24);
    let password_file = dir.join("password");
    write_private(&password_file, &password)?;
    give(&password_file, user)?;

    // The guardian first: from now on, whatever happens to this process, the server stops.
    let lifetime = MAX_LIFETIME.as_secs().to_string();
    let user_name = if user.is_some() { SERVER_USER } else { "" };
    let guardian = Command::new("sh")
        .args(["-c", GUARDIAN, "rlm-test-postgres-guardian"])
        .arg(watched.to_string())
        .arg(&lifetime)
        .arg(dir)
        .arg(bin)
        .arg(user_name)
        // Out of the test's process group (nextest's timeout and a terminal's Ctrl-C signal
        // it) and off its pipes (which nextest waits on).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("Could not start the server's guardian (`sh`): {e}"))?;
    write_private(&dir.join("guardian.pid"), &guardian.id().to_string())?;
    // Never waited for: it outlives this process on purpose and is reaped by init.
    drop(guardian);

    let mut initdb = as_server(user, &bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            ADMIN,
            "-A",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .args(["--no-sync", "--no-instructions"])
        .arg(format!("--pwfile={}", password_file.display()))
        .current_dir(dir);
    run_bounded(&mut initdb, START_TIMEOUT).map_err(|why| format!("`initdb` failed: {why}"))?;

    let log = dir.join("server.log");
    let mut last_failure = String::new();
    for _ in 0..3 {
        let port = free_port()?;
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=200"
        );
        let mut pg_ctl = as_server(user, &bin.join("pg_ctl"));
        pg_ctl
            .args([
                "start",
                "-w",
                "-s",
                "-t",
                &START_TIMEOUT.as_secs().to_string(),
            ])
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options])
            .current_dir(dir);
        match run_bounded(&mut pg_ctl, START_TIMEOUT + Duration::from_secs(10)) {
            Ok(_) if ready(bin, port) => {
                write_private(&dir.join("ready"), &port.to_string())?;
                return Ok(Server {
                    bin: bin.to_path_buf(),
                    port,
                    password,
                });
            }
            // Most likely the port was taken between choosing and binding it: another one.
            Ok(_) => last_failure = "the server did not answer on its port".to_owned(),
            Err(why) => last_failure = why,
        }
        stop(bin, &data, user);
    }
    let tail = fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(20).collect();
    Err(format!(
        "The test PostgreSQL server (`pg_ctl start` in `{}`) did not start: {last_failure}\n\
         its log ends with:\n{}",
        data.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

/// Stops the server of `data` if it runs (bounded; best effort).
fn stop(bin: &Path, data: &Path, user: Option<&User>) {
    if !data.join("postmaster.pid").exists() {
        return;
    }
    let mut pg_ctl = as_server(user, &bin.join("pg_ctl"));
    pg_ctl
        .args(["stop", "-m", "immediate", "-w", "-t", "30", "-D"])
        .arg(data);
    let _ = run_bounded(&mut pg_ctl, Duration::from_secs(40));
}

/// Removes the folders of runs whose guardian is gone (it was killed before it cleaned up).
fn sweep(root: &Path, ours: &Path, bin: &Path, user: Option<&User>) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        if dir == ours {
            continue;
        }
        let guardian = fs::read_to_string(dir.join("guardian.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok());
        let abandoned = match guardian {
            Some(pid) => !alive(pid),
            // A start that died before its guardian ran: only once it is clearly over.
            None => fs::metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > LOCK_TIMEOUT * 2),
        };
        if abandoned {
            stop(bin, &dir.join("data"), user);
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

/// Whether process `pid` exists.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Whether the server on `port` accepts connections.
fn ready(bin: &Path, port: u16) -> bool {
    let mut command = Command::new(bin.join("pg_isready"));
    command.args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-t", "10"]);
    run_bounded(&mut command, Duration::from_secs(15)).is_ok()
}

/// A port of 127.0.0.1 free a moment ago.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("Could not find a free port on 127.0.0.1: {e}"))
}

/// Writes `text` to a new file at `path` only its owner reads.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("Could not write `{}`: {e}", path.display());
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(fail)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)
}

/// `len` random letters and digits.
fn random_text(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut bytes = vec![0u8; len];
    let read = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No /dev/urandom: the time and the process id still differ between runs.
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            ^ u128::from(std::process::id());
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (seed >> ((i * 5) % 120)) as u8;
        }
    }
    bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// Runs `command` to its end within `timeout` (killed after it), its stdin empty; its stdout
/// on success, else what went wrong with its output.
fn run_bounded(command: &mut Command, timeout: Duration) -> Result<String, String> {
    let scratch = std::env::temp_dir();
    let out_path = scratch.join(format!(
        "rlm-test-postgres-{}-{}.out",
        std::process::id(),
        random_text(8)
    ));
    let out =
        File::create(&out_path).map_err(|e| format!("Could not create a scratch file: {e}"))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("Could not create a scratch file: {e}"))?;
    let result = (|| {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("could not start `{:?}`: {e}", command.get_program()))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "still running after {} s, killed",
                        timeout.as_secs()
                    ));
                }
                Err(e) => return Err(format!("could not wait for it: {e}")),
            }
        };
        let output = fs::read_to_string(&out_path).unwrap_or_default();
        if status.success() {
            Ok(output)
        } else {
            Err(format!("{status}: {}", output.trim()))
        }
    })();
    let _ = fs::remove_file(&out_path);
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
    use super::*;

    #[test]
    fn a_database_of_its_own_takes_sql_and_goes_when_dropped() {
        let server = server();
        let db = server.database();
        db.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (41)");
        assert_eq!(db.psql("SELECT x + 1 FROM t"), "42");
        let name = db.name().to_owned();
        assert!(db.url().ends_with(&format!("/{name}")));
        drop(db);
        let left = server.psql(
            "postgres",
            &format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'"),
        );
        assert_eq!(left, "0");
    }

    #[test]
    fn a_wrong_password_is_refused_over_tcp() {
        let server = server();
        let mut command = Command::new(server.bin_dir().join("psql"));
        command
            .args(["-X", "-h", "127.0.0.1", "-p", &server.port().to_string()])
            .args(["-U", ADMIN, "-d", "postgres", "-c", "SELECT 1"])
            .env("PGPASSWORD", "not-the-password")
            .env("PGCONNECT_TIMEOUT", "10");
        let err = run_bounded(&mut command, PSQL_TIMEOUT).unwrap_err();
        assert!(err.contains("password authentication failed"), "{err}");
    }

    #[test]
    fn the_server_runs_as_another_user_than_root() {
        let server = server();
        let owner = server.psql("postgres", "SELECT current_setting('data_directory')");
        let meta = fs::metadata(&owner).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if me == 0 {
            assert_ne!(meta.ok(), Some(0), "the data folder belongs to `postgres`");
        } else {
            assert_eq!(meta.ok(), Some(me));
        }
    }
}
