//! Where a run database is, as `--db` names it: an SQLite file or a PostgreSQL database.
//!
//! `postgres://…` and `postgresql://…` are PostgreSQL connection URLs (libpq's URL form:
//! `postgres://USER[:PASSWORD]@HOST[:PORT][,HOST2…]/DATABASE[?PARAM=VALUE…]`); `sqlite:PATH`
//! and anything else is the path of an SQLite file. A URL without a password takes the one in
//! `PGPASSWORD`, as `psql` does; one without a host connects to the local server's Unix
//! socket (`/var/run/postgresql`) when there is one, else to `localhost`.
//!
//! The password is a secret from the moment it is read: it is registered with the process's
//! redaction ([`bridge::secret::register`]), and the URL shows as [`PostgresUrl`]'s `Display`
//! — user, hosts and database, never the password or the parameters. A URL that does not
//! parse is reported with its password replaced, so not even an error repeats it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr as _;

use bridge::Secret;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use tokio_postgres::config::Host;

use super::StoreError;

/// The socket folder of a local PostgreSQL on Debian and Ubuntu (libpq's default there).
const LOCAL_SOCKETS: &str = "/var/run/postgresql";

/// A run database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(PostgresUrl),
}

impl Location {
    /// Reads `--db`'s value: a `postgres://` URL, or an SQLite path (`sqlite:PATH` or a plain
    /// one). A PostgreSQL password is registered for redaction before anything else happens.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        if is_postgres_url(text) {
            return PostgresUrl::parse(text).map(Self::Postgres);
        }
        let path = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
            .unwrap_or(text);
        Ok(Self::Sqlite(PathBuf::from(path)))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "{}", path.display()),
            Self::Postgres(url) => url.fmt(f),
        }
    }
}

/// Whether `text` is a PostgreSQL URL rather than a path.
fn is_postgres_url(text: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|scheme| {
        text.len() >= scheme.len() && text[..scheme.len()].eq_ignore_ascii_case(scheme)
    })
}

/// A PostgreSQL connection URL; `Display` shows it without its password.
#[derive(Clone)]
pub struct PostgresUrl {
    /// Shared: the settings are large, and a URL is passed around and cloned.
    config: std::sync::Arc<tokio_postgres::Config>,
    shown: String,
}

impl PartialEq for PostgresUrl {
    fn eq(&self, other: &Self) -> bool {
        self.shown == other.shown && self.config.get_password() == other.config.get_password()
    }
}

impl Eq for PostgresUrl {}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PostgresUrl").field(&self.shown).finish()
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl PostgresUrl {
    /// Parses a `postgres://` URL; see the module docs.
    pub(crate) fn parse(text: &str) -> Result<Self, StoreError> {
        // Before anything can fail or print: the password in every form it may show up in.
        register_url_secrets(text);
        let mut config =
            tokio_postgres::Config::from_str(text).map_err(|e| StoreError::BadUrl {
                url: hide_password(text),
                reason: e.to_string(),
            })?;
        if config.get_password().is_none()
            && let Some(password) = bridge::secret::env_secret("PGPASSWORD")
        {
            config.password(password.expose());
        }
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            if std::path::Path::new(LOCAL_SOCKETS).is_dir() {
                config.host_path(LOCAL_SOCKETS);
            } else {
                config.host("localhost");
            }
        }
        let shown = show(&config);
        Ok(Self {
            config: std::sync::Arc::new(config),
            shown,
        })
    }

    /// The connection settings (with the password).
    pub(super) fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The database's name (`None`: the server's default, the user's name).
    pub(crate) fn database(&self) -> Option<&str> {
        self.config.get_dbname()
    }

    /// The user it connects as (`None`: this process's OS user).
    pub(crate) fn user(&self) -> Option<&str> {
        self.config.get_user()
    }

    /// Whether it carries a password (in the URL or from `PGPASSWORD`).
    #[cfg(test)]
    pub(crate) fn has_password(&self) -> bool {
        self.config.get_password().is_some()
    }

    /// The hosts and ports it connects to, as `host:port` (or the socket folder).
    pub(crate) fn servers(&self) -> String {
        servers(&self.config)
    }
}

/// `postgres://USER@HOSTS/DATABASE`: what is shown of a URL.
fn show(config: &tokio_postgres::Config) -> String {
    let user = config
        .get_user()
        .map(|user| format!("{}@", encode(user)))
        .unwrap_or_default();
    let database = config
        .get_dbname()
        .map(|name| format!("/{}", encode(name)))
        .unwrap_or_default();
    format!("postgres://{user}{}{database}", servers(config))
}

/// The hosts (each with its port when one was given), comma-separated.
fn servers(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .map(ToString::to_string)
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .map(|host| match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => encode(&path.display().to_string()),
            })
            .collect()
    };
    hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            // One port for every host, or one per host.
            match ports.get(i).or(ports.first().filter(|_| ports.len() == 1)) {
                Some(port) => format!("{host}:{port}"),
                None => host.clone(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What [`encode`] escapes: the URL delimiters, spaces and control characters.
const COMPONENT: &AsciiSet = &CONTROLS
    .add(b'/')
    .add(b'@')
    .add(b':')
    .add(b'%')
    .add(b'?')
    .add(b'#')
    .add(b',')
    .add(b'&')
    .add(b'=')
    .add(b' ');

/// `text` percent-encoded where a URL component must be.
fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// The authority of a URL (between `://` and the path or query) and where it starts.
fn authority(text: &str) -> Option<(usize, &str)> {
    let start = text.find("://")? + 3;
    let rest = &text[start..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some((start, &rest[..end]))
}

/// The password of a URL's user info (`USER:PASSWORD@`), as written.
fn url_password(text: &str) -> Option<(usize, &str)> {
    let (start, authority) = authority(text)?;
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    Some((start + colon + 1, &authority[colon + 1..at]))
}

/// The values of `password=` query parameters, as written.
fn query_passwords(text: &str) -> Vec<(usize, &str)> {
    let Some(q) = text.find('?') else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut offset = q + 1;
    for pair in text[q + 1..].split('&') {
        if let Some(value) = pair.strip_prefix("password=") {
            found.push((offset + "password=".len(), value));
        }
        offset += pair.len() + 1;
    }
    found
}

/// Registers every password `text` carries, as written and percent-decoded, for redaction.
fn register_url_secrets(text: &str) {
    let written = url_password(text)
        .into_iter()
        .chain(query_passwords(text))
        .map(|(_, value)| value);
    for value in written {
        for form in [value.to_owned(), decode(value)] {
            if !form.is_empty() {
                bridge::secret::register(&Secret::new(form));
            }
        }
    }
}

/// `text` with its percent escapes decoded (as written when that is not UTF-8).
fn decode(text: &str) -> String {
    percent_decode_str(text)
        .decode_utf8()
        .map_or_else(|_| text.to_owned(), std::borrow::Cow::into_owned)
}

/// `text` with the passwords it carries replaced by `[redacted]`.
fn hide_password(text: &str) -> String {
    let mut spans: Vec<(usize, usize)> = url_password(text)
        .into_iter()
        .chain(query_passwords(text))
        .map(|(start, value)| (start, start + value.len()))
        .collect();
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if start < at {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(bridge::secret::REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

    use super::*;

    #[test]
    fn a_path_or_sqlite_prefix_is_a_file_and_a_url_is_postgres() {
        for (text, path) in [
            (".rlm/runs.db", ".rlm/runs.db"),
            ("sqlite:runs.db", "runs.db"),
            ("sqlite:///tmp/runs.db", "/tmp/runs.db"),
            ("postgres.db", "postgres.db"),
        ] {
            assert_eq!(
                Location::parse(text).unwrap(),
                Location::Sqlite(path.into())
            );
        }
        let Location::Postgres(url) =
            Location::parse("postgresql://rlm:s3cret-pw-42@db.example:6543/runs").unwrap()
        else {
            panic!("a PostgreSQL URL");
        };
        assert_eq!(url.to_string(), "postgres://rlm@db.example:6543/runs");
        assert_eq!((url.user(), url.database()), (Some("rlm"), Some("runs")));
        assert!(url.has_password());
        assert!(!format!("{url:?}").contains("s3cret"));
    }

    #[test]
    fn the_password_is_redacted_in_every_form_and_never_shown() {
        let text = "postgres://rlm:p%40ss-w0rd-99@h1:5432,h2:5433/runs?password=other-secret-77";
        let url = PostgresUrl::parse(text).unwrap();
        assert_eq!(url.to_string(), "postgres://rlm@h1:5432,h2:5433/runs");
        let redactor = bridge::secret::redactor();
        for form in ["p%40ss-w0rd-99", "p@ss-w0rd-99", "other-secret-77"] {
            assert_eq!(redactor.redact(form), "[redacted]", "{form}");
        }
        assert_eq!(
            hide_password(text),
            "postgres://rlm:[redacted]@h1:5432,h2:5433/runs?password=[redacted]"
        );
    }

    #[test]
    fn a_bad_url_is_reported_without_its_password() {
        let err = Location::parse("postgres://rlm:hunter2-hunter2@host:notaport/db").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::BadUrl { .. }), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("postgres://rlm:[redacted]@host:notaport/db"),
            "{text}"
        );
    }

    #[test]
    fn a_url_without_a_host_goes_to_the_local_server() {
        let url = PostgresUrl::parse("postgres:///runs").unwrap();
        let shown = url.to_string();
        if std::path::Path::new(LOCAL_SOCKETS).is_dir() {
            assert_eq!(shown, "postgres://%2Fvar%2Frun%2Fpostgresql/runs");
        } else {
            assert_eq!(shown, "postgres://localhost/runs");
        }
    }
}
