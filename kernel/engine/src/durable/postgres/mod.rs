//! The PostgreSQL store: one run database shared by many hosts.
//!
//! The tables are the SQLite store's, in a schema `rlm` of their own (`postgres/schema.rs`,
//! versioned migrations), and every operation is the same transaction: a put locks the run's
//! row (`SELECT … FOR UPDATE`), checks the writer's lease, writes the checkpoint, its writes
//! (one statement for all of them) and, when the policy says so, a snapshot, and moves the
//! run's head; a claim locks the same row first, so claims and puts on one run are
//! serialised and never deadlock (every writing transaction takes the run's row, then the
//! lease's).
//!
//! # Leases across hosts
//!
//! A pid says nothing on another host, so a lease here also **expires**: its driver renews it
//! with a [`heartbeat`](Store::heartbeat) (the engine does every third of
//! [`lease_expiry`](Store::lease_expiry), [`DEFAULT_LEASE_EXPIRY`] unless set), and a lease
//! not renewed in time is free for the next claimer on any host. Expiry is judged in the
//! server's clock (`rlm.now_ms()`), never a host's, so hosts whose clocks disagree still
//! agree. Fencing covers it: a put, a status change and a heartbeat all check that their
//! lease is still the run's *and has not expired*, in the same transaction, so a driver that
//! was frozen or cut off past its expiry writes nothing more, even before anyone took over
//! ([`StoreError::LeaseExpired`]). On the driver's own host the pid check still applies: a
//! killed driver's run is taken over at once, without waiting for the expiry.
//!
//! # Why tokio-postgres and deadpool-postgres
//!
//! `tokio-postgres` is the asynchronous client the synchronous `postgres` crate wraps, on the
//! runtime the engine already runs on: a checkpoint write is a network round trip awaited on
//! the async worker, never a blocked thread. `deadpool-postgres` adds a small pool (a put and
//! a heartbeat go on their own connections at once) with timeouts on waiting for and opening
//! a connection, and a statement cache. Both are small; `sqlx` would bring its macros, its
//! own pool and drivers for other databases to build on a 2-core machine for nothing we use.
//! No TLS (`NoTls`): a server that requires it is reported as such; only the `runtime`
//! feature of each is on.
//!
//! Every wait is bounded: connecting ([`CONNECT_TIMEOUT`] unless the URL sets
//! `connect_timeout`), waiting for a pooled connection and each operation
//! ([`OPERATION_TIMEOUT`]), and on the server `statement_timeout` and `lock_timeout`.

mod schema;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls, Row};

use super::StoreError;
use super::lease::{Claim, Lease, LeaseHolder, Owner};
use super::location::{Location, PostgresUrl};
use super::record::{
    CheckpointColumns, CheckpointId, CheckpointRecord, CheckpointState, Failure, NewCheckpoint,
    NewRun, ParentRow, Planned, PruneReport, RowError, RunColumns, RunRecord, RunStatus,
    SnapshotPolicy, parse_write, replaceable, replay,
};
use super::store::Store;
use crate::state::StateDelta;

/// How long a lease lasts without a heartbeat unless set otherwise.
pub(crate) const DEFAULT_LEASE_EXPIRY: Duration = Duration::from_secs(30);

/// The longest a connection may take to open, unless the URL's `connect_timeout` says.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest one store operation may take (waiting for a connection included).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(300);

/// Connections per store: a put, a heartbeat and a read at once, and one to spare.
const POOL_SIZE: usize = 4;

/// Server settings of every connection: bounded statements and lock waits.
const SESSION_OPTIONS: &str = "-c statement_timeout=300000 -c lock_timeout=30000 \
     -c idle_in_transaction_session_timeout=300000";

/// The tables, for [`PostgresStore::size_bytes`].
const TABLES: [&str; 6] = [
    "rlm.runs",
    "rlm.checkpoints",
    "rlm.writes",
    "rlm.snapshots",
    "rlm.leases",
    "rlm.schema_version",
];

/// Runs of a PostgreSQL database; cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    url: PostgresUrl,
    location: Location,
    policy: SnapshotPolicy,
    lease_expiry: Duration,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.url)
            .field("lease_expiry", &self.lease_expiry)
            .finish_non_exhaustive()
    }
}

impl From<tokio_postgres::Error> for Failure<PoolError> {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Driver(PoolError::Backend(e))
    }
}

impl From<PoolError> for Failure<PoolError> {
    fn from(e: PoolError) -> Self {
        Self::Driver(e)
    }
}

type Res<T> = Result<T, Failure<PoolError>>;

/// A transaction of the pool's.
type Tx<'c> = deadpool_postgres::Transaction<'c>;

impl PostgresStore {
    /// Connects to the database at `url` for reading and writing; creates the schema on
    /// first use and upgrades an older one. Connection errors, a missing database, a refused
    /// login and a newer schema are each their own [`StoreError`], saying what to do.
    pub async fn connect(url: &PostgresUrl) -> Result<Self, StoreError> {
        let store = Self::with_pool(url, false)?;
        let found = store.schema_version().await?;
        match found {
            Some(found) if found == schema::VERSION => {}
            Some(found) if found > schema::VERSION => return Err(store.newer(found)),
            _ => store.upgrade().await?,
        }
        Ok(store)
    }

    /// Connects to the database at `url` only to read it (`rlm flow runs`, `history`): its
    /// sessions are read-only (`default_transaction_read_only`). An older schema is upgraded
    /// first, as before any read; a database without the schema is [`StoreError::Missing`].
    pub(crate) async fn connect_read_only(url: &PostgresUrl) -> Result<Self, StoreError> {
        let store = Self::with_pool(url, true)?;
        match store.schema_version().await? {
            None => Err(StoreError::Missing {
                db: url.to_string(),
            }),
            Some(found) if found > schema::VERSION => Err(store.newer(found)),
            Some(found) if found < schema::VERSION => {
                Self::connect(url).await?;
                Ok(store)
            }
            Some(_) => Ok(store),
        }
    }

    /// With this snapshot policy.
    #[cfg(test)]
    pub(crate) fn with_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// With leases that last `expiry` without a heartbeat (at least a second).
    pub(crate) fn with_lease_expiry(mut self, expiry: Duration) -> Self {
        self.lease_expiry = expiry.max(Duration::from_secs(1));
        self
    }

    /// The bytes the store's tables take on the server, indexes and out-of-line values
    /// included (`pg_total_relation_size`).
    pub async fn size_bytes(&self) -> Result<i64, StoreError> {
        let sql = TABLES
            .iter()
            .map(|table| format!("pg_total_relation_size('{table}')"))
            .collect::<Vec<_>>()
            .join(" + ");
        self.read(async |tx| {
            let row = query_one(tx, &format!("SELECT ({sql})::bigint"), &[]).await?;
            Ok(row.try_get::<_, i64>(0)?)
        })
        .await
    }

    /// A store on a new pool of connections to `url` (none opened yet).
    fn with_pool(url: &PostgresUrl, read_only: bool) -> Result<Self, StoreError> {
        let mut config = url.config().clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A peer that vanished (a host cut off) is noticed within about half a minute.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("rlm");
        }
        let mut options = config.get_options().unwrap_or_default().to_owned();
        options.push(' ');
        options.push_str(SESSION_OPTIONS);
        if read_only {
            options.push_str(" -c default_transaction_read_only=on");
        }
        config.options(options.trim());
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let connect = url
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(OPERATION_TIMEOUT))
            .create_timeout(Some(connect * 2))
            .recycle_timeout(Some(connect))
            .build()
            .map_err(|e| StoreError::Postgres {
                db: url.to_string(),
                reason: format!("could not set up its connection pool: {e}"),
            })?;
        Ok(Self {
            pool,
            url: url.clone(),
            location: Location::Postgres(url.clone()),
            policy: SnapshotPolicy::default(),
            lease_expiry: DEFAULT_LEASE_EXPIRY,
        })
    }

    fn newer(&self, found: i64) -> StoreError {
        StoreError::NewerSchema {
            db: self.url.to_string(),
            found,
            supported: schema::VERSION,
        }
    }

    /// The schema's version, `None` when there is none yet.
    async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        self.read(async |tx| read_version(tx).await).await
    }

    /// Creates or upgrades the schema, under the upgrade lock (see `schema`).
    async fn upgrade(&self) -> Result<(), StoreError> {
        self.write(async |tx| {
            execute(
                tx,
                "SELECT pg_advisory_xact_lock($1)",
                &[&schema::UPGRADE_LOCK],
            )
            .await?;
            tx.batch_execute(schema::PREPARE).await?;
            let found = read_version(tx).await?.unwrap_or(0);
            if found > schema::VERSION {
                return Ok(Some(found));
            }
            let done = usize::try_from(found).unwrap_or(0);
            for step in schema::MIGRATIONS.iter().skip(done) {
                tx.batch_execute(step).await?;
            }
            execute(tx, "DELETE FROM rlm.schema_version", &[]).await?;
            execute(
                tx,
                "INSERT INTO rlm.schema_version (version) VALUES ($1)",
                &[&schema::VERSION],
            )
            .await?;
            Ok(None)
        })
        .await?
        .map_or(Ok(()), |found| Err(self.newer(found)))
    }

    /// Runs `work` in a read-write transaction (committed by `work` returning `Ok`).
    async fn write<T: Send>(
        &self,
        work: impl AsyncFnOnce(&Tx<'_>) -> Res<T>,
    ) -> Result<T, StoreError> {
        self.transaction(IsolationLevel::ReadCommitted, false, work)
            .await
    }

    /// Runs `work` in a read-only transaction that sees one snapshot of the database.
    async fn read<T: Send>(
        &self,
        work: impl AsyncFnOnce(&Tx<'_>) -> Res<T>,
    ) -> Result<T, StoreError> {
        self.transaction(IsolationLevel::RepeatableRead, true, work)
            .await
    }

    async fn transaction<T: Send>(
        &self,
        isolation: IsolationLevel,
        read_only: bool,
        work: impl AsyncFnOnce(&Tx<'_>) -> Res<T>,
    ) -> Result<T, StoreError> {
        let run = async {
            let mut client = self.pool.get().await?;
            // A read-write transaction takes the session's default, which a read-only store
            // sets to read-only.
            let builder = client.build_transaction().isolation_level(isolation);
            let tx = if read_only {
                builder.read_only(true)
            } else {
                builder
            }
            .start()
            .await?;
            let value = work(&tx).await?;
            tx.commit().await?;
            Ok(value)
        };
        match tokio::time::timeout(OPERATION_TIMEOUT, run).await {
            Ok(result) => result.map_err(|failure| self.store_error(failure)),
            Err(_) => Err(StoreError::Unreachable {
                db: self.url.to_string(),
                reason: format!(
                    "no answer within {} s (the transaction was not committed)",
                    OPERATION_TIMEOUT.as_secs()
                ),
            }),
        }
    }

    /// `failure` as the store error it is; see [`classify`].
    fn store_error(&self, failure: Failure<PoolError>) -> StoreError {
        match failure {
            Failure::Driver(PoolError::Backend(e)) => classify(&self.url, &e),
            Failure::Driver(PoolError::Timeout(_)) => StoreError::Unreachable {
                db: self.url.to_string(),
                reason: "no connection could be opened in time".to_owned(),
            },
            Failure::Driver(other) => StoreError::Postgres {
                db: self.url.to_string(),
                reason: redacted(&other.to_string()),
            },
            Failure::Row(e) => e.into_store_error(self.url.to_string()),
            Failure::Store(e) => e,
        }
    }

    fn expiry_ms(&self) -> i64 {
        i64::try_from(self.lease_expiry.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A PostgreSQL error as the store error it is: a refused login, a missing database, a
/// missing privilege, a server that cannot be reached, or the server's own message.
fn classify(url: &PostgresUrl, e: &tokio_postgres::Error) -> StoreError {
    let db = url.to_string();
    if let Some(server) = e.as_db_error() {
        let code = server.code();
        let reason = redacted(server.message());
        return if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            StoreError::Refused {
                db,
                user: user_of(url),
                reason,
            }
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            StoreError::NoSuchDatabase {
                db,
                servers: url.servers(),
                name: url.database().map_or_else(|| user_of(url), str::to_owned),
            }
        } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            StoreError::Permission { db, reason }
        } else if [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::TOO_MANY_CONNECTIONS,
        ]
        .contains(code)
        {
            StoreError::Unreachable { db, reason }
        } else {
            StoreError::Postgres {
                db,
                reason: format!("{reason} (SQLSTATE {})", code.code()),
            }
        };
    }
    // The client's message and its causes (`error connecting to server: Connection refused`).
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let text = redacted(&text);
    if text.contains("password missing") {
        StoreError::Refused {
            db,
            user: user_of(url),
            reason: "the server asks for a password and none was given (put it in the URL or \
                     in `PGPASSWORD`)"
                .to_owned(),
        }
    } else if text.to_ascii_lowercase().contains("tls") {
        StoreError::Postgres {
            db,
            reason: format!(
                "{text}: this rlm connects without TLS; use a server (or `pg_hba.conf` rule) \
                 that accepts a plain connection from this host, e.g. over a private network \
                 or an SSH tunnel"
            ),
        }
    } else if e.is_closed() {
        StoreError::Unreachable {
            db,
            reason: "the connection was closed (the server restarted, or the network dropped \
                     it)"
            .to_owned(),
        }
    } else {
        StoreError::Unreachable { db, reason: text }
    }
}

/// The user a URL connects as: its own, else this process's OS user (what the client sends).
fn user_of(url: &PostgresUrl) -> String {
    url.user().map_or_else(
        || std::env::var("USER").unwrap_or_else(|_| "(this OS user)".to_owned()),
        str::to_owned,
    )
}

/// `text` with every secret this process knows redacted (a server echoing a URL back).
fn redacted(text: &str) -> String {
    bridge::secret::redactor().redact(text).into_owned()
}

#[async_trait]
impl Store for PostgresStore {
    fn location(&self) -> &Location {
        &self.location
    }

    fn lease_expiry(&self) -> Option<Duration> {
        Some(self.lease_expiry)
    }

    async fn create_run(&self, run: &NewRun, owner: &Owner) -> Result<Lease, StoreError> {
        let expiry = self.expiry_ms();
        self.write(async |tx| {
            let created = execute(
                tx,
                "INSERT INTO rlm.runs (run_id, workflow, status, detail, input, head, \
                         created_ms, updated_ms) \
                         VALUES ($1, $2, 'running', NULL, $3, NULL, rlm.now_ms(), rlm.now_ms()) \
                         ON CONFLICT (run_id) DO NOTHING",
                &[&run.run_id, &run.workflow, &run.input.to_string()],
            )
            .await?;
            if created == 0 {
                return Err(StoreError::DuplicateRun(run.run_id.clone()).into());
            }
            insert_lease(tx, &run.run_id, owner, expiry).await
        })
        .await
    }

    async fn claim(
        &self,
        run_id: &str,
        owner: &Owner,
        take_over: bool,
    ) -> Result<Claim, StoreError> {
        let expiry = self.expiry_ms();
        self.write(async |tx| {
            lock_run(tx, run_id).await?;
            let replaced = match lease_of(tx, run_id).await? {
                Some((id, holder)) => {
                    let holder = replaceable(run_id, holder, take_over)?;
                    execute(tx, "DELETE FROM rlm.leases WHERE id = $1", &[&id]).await?;
                    Some(holder)
                }
                None => None,
            };
            let lease = insert_lease(tx, run_id, owner, expiry).await?;
            Ok(Claim { lease, replaced })
        })
        .await
    }

    async fn check_claim(
        &self,
        run_id: &str,
        take_over: bool,
    ) -> Result<Option<LeaseHolder>, StoreError> {
        self.read(async |tx| {
            if !run_exists(tx, run_id).await? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            Ok(lease_of(tx, run_id)
                .await?
                .map(|(_, holder)| replaceable(run_id, holder, take_over))
                .transpose()?)
        })
        .await
    }

    async fn heartbeat(&self, lease: &Lease) -> Result<(), StoreError> {
        let expiry = self.expiry_ms();
        self.write(async |tx| {
            // Only a lease that has not run out is renewed: once expired, it stays so.
            let renewed = execute(
                tx,
                "UPDATE rlm.leases SET renewed_ms = rlm.now_ms(), \
                         expires_ms = rlm.now_ms() + $3 \
                         WHERE id = $1 AND run_id = $2 AND expires_ms > rlm.now_ms()",
                &[&lease.id, &lease.run_id, &expiry],
            )
            .await?;
            if renewed == 1 {
                return Ok(());
            }
            fence(tx, lease).await
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.write(async |tx| {
            execute(tx, "DELETE FROM rlm.leases WHERE id = $1", &[&lease.id]).await?;
            Ok(())
        })
        .await
    }

    async fn write_status(
        &self,
        lease: &Lease,
        status: &RunStatus,
        release: bool,
    ) -> Result<(), StoreError> {
        self.write(async |tx| {
            lock_run(tx, &lease.run_id).await?;
            fence(tx, lease).await?;
            execute(
                tx,
                "UPDATE rlm.runs SET status = $2, detail = $3, updated_ms = rlm.now_ms() \
                     WHERE run_id = $1",
                &[&lease.run_id, &status.name(), &status.detail()],
            )
            .await?;
            if release {
                execute(tx, "DELETE FROM rlm.leases WHERE id = $1", &[&lease.id]).await?;
            }
            Ok(())
        })
        .await
    }

    async fn put_chain(
        &self,
        lease: &Lease,
        checkpoints: Vec<NewCheckpoint<'_>>,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        let policy = self.policy;
        let checkpoints = &checkpoints;
        self.write(async |tx| put_chain(tx, lease, checkpoints, policy).await)
            .await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.read(async |tx| {
            let rows = query(tx, &format!("{RUN_SELECT} WHERE r.run_id = $1"), &[&run_id]).await?;
            match rows.first() {
                Some(row) => Ok(Some(run_columns(row)?.into_record()?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read(async |tx| {
            let rows = query(
                tx,
                &format!("{RUN_SELECT} ORDER BY r.created_ms, r.run_id"),
                &[],
            )
            .await?;
            rows.iter()
                .map(|row| Ok(run_columns(row)?.into_record()?))
                .collect()
        })
        .await
    }

    async fn history(&self, run_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.read(async |tx| {
            if !run_exists(tx, run_id).await? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            let rows = query(
                tx,
                &format!("{CHECKPOINT_SELECT} WHERE c.run_id = $1 ORDER BY c.id"),
                &[&run_id],
            )
            .await?;
            rows.iter()
                .map(|row| Ok(checkpoint_columns(row)?.into_record()?))
                .collect()
        })
        .await
    }

    async fn checkpoint(&self, id: CheckpointId) -> Result<CheckpointRecord, StoreError> {
        self.read(async |tx| checkpoint_record(tx, id).await).await
    }

    async fn writes(&self, id: CheckpointId) -> Result<StateDelta, StoreError> {
        self.read(async |tx| {
            parent_row(tx, id).await?;
            let rows = write_rows(tx, &[id]).await?;
            Ok(rows
                .into_iter()
                .map(|(_, key, op, value)| parse_write(key, &op, value))
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn state_at(&self, id: CheckpointId) -> Result<CheckpointState, StoreError> {
        self.read(async |tx| state_at(tx, id).await).await
    }

    async fn prune(&self, run_id: &str, keep_last: usize) -> Result<PruneReport, StoreError> {
        self.write(async |tx| prune(tx, run_id, keep_last).await)
            .await
    }
}

/// `sql` run with `params`, prepared once per connection (the statement cache).
async fn query(tx: &Tx<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Res<Vec<Row>> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query(&statement, params).await?)
}

/// [`query`] of at most one row.
async fn query_opt(tx: &Tx<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Res<Option<Row>> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query_opt(&statement, params).await?)
}

/// [`query`] of exactly one row.
async fn query_one(tx: &Tx<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Res<Row> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query_one(&statement, params).await?)
}

/// [`query`] of a statement that returns no rows: how many it changed.
async fn execute(tx: &Tx<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Res<u64> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&statement, params).await?)
}

/// The schema's version, `None` when there is none yet. Not from the statement cache: the
/// table may not exist yet, or appear in the same transaction.
async fn read_version(tx: &Tx<'_>) -> Res<Option<i64>> {
    let exists: bool = tx.query_one(schema::EXISTS, &[]).await?.try_get(0)?;
    if !exists {
        return Ok(None);
    }
    Ok(tx.query_one(schema::READ_VERSION, &[]).await?.try_get(0)?)
}

/// Locks run `run_id`'s row for the rest of the transaction (every writer of a run takes it
/// first, so they run one after the other); [`StoreError::UnknownRun`] when there is none.
async fn lock_run(tx: &Tx<'_>, run_id: &str) -> Res<()> {
    let found = query_opt(
        tx,
        "SELECT 1 FROM rlm.runs WHERE run_id = $1 FOR UPDATE",
        &[&run_id],
    )
    .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(StoreError::UnknownRun(run_id.to_owned()).into()),
    }
}

async fn run_exists(tx: &Tx<'_>, run_id: &str) -> Res<bool> {
    Ok(
        query_opt(tx, "SELECT 1 FROM rlm.runs WHERE run_id = $1", &[&run_id])
            .await?
            .is_some(),
    )
}

/// The columns of a lease holder, and the server's clock to judge its expiry by.
const HOLDER_COLUMNS: &str = "l.pid, l.host, l.started, l.claimed_ms, l.expires_ms, rlm.now_ms()";

/// The lease holder in the columns from `first` on ([`HOLDER_COLUMNS`]), if any.
fn holder_columns(row: &Row, first: usize) -> Res<Option<LeaseHolder>> {
    let Some(pid) = row.try_get::<_, Option<i64>>(first)? else {
        return Ok(None);
    };
    let expires_ms: i64 = row.try_get(first + 4)?;
    let now_ms: i64 = row.try_get(first + 5)?;
    Ok(Some(LeaseHolder {
        owner: Owner {
            pid: u32::try_from(pid).unwrap_or(0),
            host: row.try_get(first + 1)?,
            started: row.try_get(first + 2)?,
        },
        since_ms: row.try_get(first + 3)?,
        expires_ms: Some(expires_ms),
        expired: expires_ms <= now_ms,
    }))
}

/// The lease on run `run_id`, if one is held: its id and holder.
async fn lease_of(tx: &Tx<'_>, run_id: &str) -> Res<Option<(i64, LeaseHolder)>> {
    let row = query_opt(
        tx,
        &format!("SELECT l.id, {HOLDER_COLUMNS} FROM rlm.leases l WHERE l.run_id = $1"),
        &[&run_id],
    )
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let id: i64 = row.try_get(0)?;
    Ok(holder_columns(&row, 1)?.map(|holder| (id, holder)))
}

async fn insert_lease(tx: &Tx<'_>, run_id: &str, owner: &Owner, expiry_ms: i64) -> Res<Lease> {
    let row = query_one(
        tx,
        "INSERT INTO rlm.leases (run_id, pid, host, started, claimed_ms, renewed_ms, \
             expires_ms) VALUES ($1, $2, $3, $4, rlm.now_ms(), rlm.now_ms(), rlm.now_ms() + $5) \
             RETURNING id",
        &[
            &run_id,
            &i64::from(owner.pid),
            &owner.host,
            &owner.started,
            &expiry_ms,
        ],
    )
    .await?;
    Ok(Lease {
        run_id: run_id.to_owned(),
        id: row.try_get(0)?,
    })
}

/// Fencing: fails unless `lease` is still the lease of its run and has not expired.
async fn fence(tx: &Tx<'_>, lease: &Lease) -> Res<()> {
    match lease_of(tx, &lease.run_id).await? {
        Some((id, holder)) if id == lease.id && !holder.expired => Ok(()),
        Some((id, holder)) if id == lease.id => Err(StoreError::LeaseExpired {
            run_id: lease.run_id.clone(),
            expired_ms: holder.expires_ms.unwrap_or(holder.since_ms),
        }
        .into()),
        holder => {
            if !run_exists(tx, &lease.run_id).await? {
                return Err(StoreError::UnknownRun(lease.run_id.clone()).into());
            }
            Err(StoreError::LeaseLost {
                run_id: lease.run_id.clone(),
                holder: holder.map(|(_, holder)| holder),
            }
            .into())
        }
    }
}

async fn parent_row(tx: &Tx<'_>, id: CheckpointId) -> Res<ParentRow> {
    let row = query_opt(
        tx,
        "SELECT run_id, step, chain_bytes, chain_len, base_bytes FROM rlm.checkpoints \
             WHERE id = $1",
        &[&id],
    )
    .await?
    .ok_or(Failure::Store(StoreError::UnknownCheckpoint(id)))?;
    Ok(ParentRow {
        run_id: row.try_get(0)?,
        step: row.try_get(1)?,
        chain_bytes: row.try_get(2)?,
        chain_len: row.try_get(3)?,
        base_bytes: row.try_get(4)?,
    })
}

/// Writes `checkpoints` of the run of `lease` as one chain (see [`Store::put_chain`]).
async fn put_chain(
    tx: &Tx<'_>,
    lease: &Lease,
    checkpoints: &[NewCheckpoint<'_>],
    policy: SnapshotPolicy,
) -> Res<Vec<CheckpointId>> {
    let run_id = lease.run_id.as_str();
    lock_run(tx, run_id).await?;
    fence(tx, lease).await?;
    let mut ids: Vec<CheckpointId> = Vec::with_capacity(checkpoints.len());
    for checkpoint in checkpoints {
        let parent = ids.last().copied().or(checkpoint.parent);
        ids.push(insert_checkpoint(tx, run_id, checkpoint, parent, policy).await?);
    }
    if let Some(head) = ids.last() {
        execute(
            tx,
            "UPDATE rlm.runs SET head = $2, updated_ms = rlm.now_ms() WHERE run_id = $1",
            &[&run_id, head],
        )
        .await?;
    }
    Ok(ids)
}

/// Inserts `checkpoint` of run `run_id` after `parent` (its writes, and a snapshot when it
/// takes one), inside the caller's transaction.
async fn insert_checkpoint(
    tx: &Tx<'_>,
    run_id: &str,
    checkpoint: &NewCheckpoint<'_>,
    parent: Option<CheckpointId>,
    policy: SnapshotPolicy,
) -> Res<CheckpointId> {
    let row = match parent {
        Some(id) => Some(parent_row(tx, id).await?),
        None => None,
    };
    let planned = Planned::new(checkpoint, parent, run_id, row, policy)?;
    // The state is rebuilt and serialised only when this checkpoint takes a snapshot.
    let base = match planned.snapshot_base() {
        Some(id) => Some(state_at(tx, id).await?),
        None => None,
    };
    let chained = planned.chained(base)?;
    let id: i64 = query_one(
        tx,
        "INSERT INTO rlm.checkpoints (run_id, parent_id, step, node, next, metadata, \
             created_ms, write_bytes, chain_bytes, chain_len, base_bytes) \
             VALUES ($1, $2, $3, $4, $5, $6, rlm.now_ms(), $7, $8, $9, $10) RETURNING id",
        &[
            &run_id,
            &parent,
            &planned.step,
            &checkpoint.node,
            &serde_json::to_string(&checkpoint.next)?,
            &checkpoint.metadata.to_string(),
            &planned.write_bytes,
            &chained.chain_bytes,
            &chained.chain_len,
            &chained.base_bytes,
        ],
    )
    .await?
    .try_get(0)?;
    if !planned.rows.is_empty() {
        // One statement for all of a step's writes (the first checkpoint writes the whole
        // state, key by key).
        let seqs: Vec<i32> = (0..planned.rows.len())
            .map(|seq| i32::try_from(seq).unwrap_or(i32::MAX))
            .collect();
        let keys: Vec<&str> = planned.rows.iter().map(|(key, _, _)| *key).collect();
        let ops: Vec<&str> = planned.rows.iter().map(|(_, op, _)| *op).collect();
        let values: Vec<Option<&str>> = planned
            .rows
            .iter()
            .map(|(_, _, value)| value.as_deref())
            .collect();
        execute(
            tx,
            "INSERT INTO rlm.writes (checkpoint_id, seq, key, op, value) \
             SELECT $1, w.seq, w.key, w.op, w.value \
             FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[]) AS w(seq, key, op, value)",
            &[&id, &seqs, &keys, &ops, &values],
        )
        .await?;
    }
    if let Some((state, versions)) = &chained.snapshot {
        execute(
            tx,
            "INSERT INTO rlm.snapshots (checkpoint_id, state, versions) VALUES ($1, $2, $3)",
            &[&id, state, versions],
        )
        .await?;
    }
    Ok(id)
}

const RUN_SELECT: &str = "SELECT r.run_id, r.workflow, r.status, r.detail, r.input, r.head, \
     (SELECT count(*) FROM rlm.checkpoints c WHERE c.run_id = r.run_id), r.created_ms, \
     r.updated_ms, l.pid, l.host, l.started, l.claimed_ms, l.expires_ms, rlm.now_ms() \
     FROM rlm.runs r LEFT JOIN rlm.leases l ON l.run_id = r.run_id";

fn run_columns(row: &Row) -> Res<RunColumns> {
    Ok(RunColumns {
        run_id: row.try_get(0)?,
        workflow: row.try_get(1)?,
        status: row.try_get(2)?,
        detail: row.try_get(3)?,
        input: row.try_get(4)?,
        head: row.try_get(5)?,
        checkpoints: row.try_get(6)?,
        created_ms: row.try_get(7)?,
        updated_ms: row.try_get(8)?,
        lease: holder_columns(row, 9)?,
    })
}

/// A checkpoint's columns, its snapshot flag and the keys it wrote, in order.
const CHECKPOINT_SELECT: &str = "SELECT c.id, c.run_id, c.parent_id, c.step, c.node, c.next, \
     c.metadata, c.created_ms, c.write_bytes, \
     EXISTS (SELECT 1 FROM rlm.snapshots s WHERE s.checkpoint_id = c.id), \
     ARRAY(SELECT w.key FROM rlm.writes w WHERE w.checkpoint_id = c.id ORDER BY w.seq) \
     FROM rlm.checkpoints c";

fn checkpoint_columns(row: &Row) -> Res<CheckpointColumns> {
    Ok(CheckpointColumns {
        id: row.try_get(0)?,
        run_id: row.try_get(1)?,
        parent: row.try_get(2)?,
        step: row.try_get(3)?,
        node: row.try_get(4)?,
        next: row.try_get(5)?,
        metadata: row.try_get(6)?,
        created_ms: row.try_get(7)?,
        write_bytes: row.try_get(8)?,
        snapshot: row.try_get(9)?,
        written: row.try_get(10)?,
    })
}

async fn checkpoint_record(tx: &Tx<'_>, id: CheckpointId) -> Res<CheckpointRecord> {
    let row = query_opt(tx, &format!("{CHECKPOINT_SELECT} WHERE c.id = $1"), &[&id])
        .await?
        .ok_or(Failure::Store(StoreError::UnknownCheckpoint(id)))?;
    Ok(checkpoint_columns(&row)?.into_record()?)
}

/// The write rows of checkpoints `ids`, by checkpoint and in order: id, key, op, value.
async fn write_rows(
    tx: &Tx<'_>,
    ids: &[CheckpointId],
) -> Res<Vec<(CheckpointId, String, String, Option<String>)>> {
    let rows = query(
        tx,
        "SELECT checkpoint_id, key, op, value FROM rlm.writes \
             WHERE checkpoint_id = ANY($1) ORDER BY checkpoint_id, seq",
        &[&ids],
    )
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
            ))
        })
        .collect()
}

/// The checkpoints from the nearest snapshot down to `id`, oldest first: (id, step).
async fn chain(tx: &Tx<'_>, id: CheckpointId) -> Res<Vec<(CheckpointId, i64)>> {
    parent_row(tx, id).await?;
    let rows = query(
        tx,
        "WITH RECURSIVE chain(id, parent_id, step, snap) AS ( \
               SELECT c.id, c.parent_id, c.step, \
                 EXISTS (SELECT 1 FROM rlm.snapshots s WHERE s.checkpoint_id = c.id) \
               FROM rlm.checkpoints c WHERE c.id = $1 \
               UNION ALL \
               SELECT c.id, c.parent_id, c.step, \
                 EXISTS (SELECT 1 FROM rlm.snapshots s WHERE s.checkpoint_id = c.id) \
               FROM rlm.checkpoints c JOIN chain ON c.id = chain.parent_id WHERE NOT chain.snap \
             ) SELECT id, step, snap FROM chain ORDER BY id",
        &[&id],
    )
    .await?;
    let chain = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<_, i64>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, bool>(2)?,
            ))
        })
        .collect::<Res<Vec<_>>>()?;
    match chain.first() {
        Some((_, _, true)) => Ok(chain.into_iter().map(|(id, step, _)| (id, step)).collect()),
        _ => Err(RowError::Damaged(format!("checkpoint {id} has no snapshot before it")).into()),
    }
}

async fn state_at(tx: &Tx<'_>, id: CheckpointId) -> Res<CheckpointState> {
    let chain = chain(tx, id).await?;
    let (base, _) = chain[0];
    let row = query_one(
        tx,
        "SELECT state, versions FROM rlm.snapshots WHERE checkpoint_id = $1",
        &[&base],
    )
    .await?;
    let (state, versions): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    let later: Vec<CheckpointId> = chain[1..].iter().map(|(id, _)| *id).collect();
    let mut rows = write_rows(tx, &later).await?.into_iter().peekable();
    let mut replayed = Vec::with_capacity(later.len());
    for &(id, step) in &chain[1..] {
        let mut writes = Vec::new();
        while let Some((_, key, op, value)) = rows.next_if(|(of, ..)| *of == id) {
            writes.push((key, op, value));
        }
        replayed.push((step, writes));
    }
    Ok(replay((&state, &versions), replayed)?)
}

/// Keeps the last `keep_last` checkpoints of run `run_id` (see [`Store::prune`]).
async fn prune(tx: &Tx<'_>, run_id: &str, keep_last: usize) -> Res<PruneReport> {
    lock_run(tx, run_id).await?;
    if let Some((_, holder)) = lease_of(tx, run_id).await? {
        replaceable(run_id, holder, false)?;
    }
    let keep = i64::try_from(keep_last.max(1)).unwrap_or(i64::MAX);
    let oldest_kept: Option<i64> = query_opt(
        tx,
        "SELECT id FROM rlm.checkpoints WHERE run_id = $1 ORDER BY id DESC \
             LIMIT 1 OFFSET $2",
        &[&run_id, &(keep - 1)],
    )
    .await?
    .map(|row| row.try_get(0))
    .transpose()?;
    let Some(oldest_kept) = oldest_kept else {
        return Ok(PruneReport::default());
    };
    // Kept checkpoints whose parent goes: each starts a chain of its own from now on.
    let orphans = query(
        tx,
        "SELECT c.id, EXISTS (SELECT 1 FROM rlm.snapshots s WHERE s.checkpoint_id = c.id) \
             FROM rlm.checkpoints c WHERE c.run_id = $1 AND c.id >= $2 \
             AND c.parent_id IS NOT NULL AND c.parent_id < $2 ORDER BY c.id",
        &[&run_id, &oldest_kept],
    )
    .await?;
    let mut report = PruneReport::default();
    for row in &orphans {
        let id: i64 = row.try_get(0)?;
        let has_snapshot: bool = row.try_get(1)?;
        if !has_snapshot {
            let at = state_at(tx, id).await?;
            let text = serde_json::to_string(&at.state)?;
            let bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
            execute(
                tx,
                "INSERT INTO rlm.snapshots (checkpoint_id, state, versions) VALUES ($1, $2, $3)",
                &[&id, &text, &serde_json::to_string(&at.versions)?],
            )
            .await?;
            execute(
                tx,
                "UPDATE rlm.checkpoints SET chain_bytes = 0, chain_len = 0, base_bytes = $2 \
                 WHERE id = $1",
                &[&id, &bytes],
            )
            .await?;
            report.snapshotted.push(id);
        }
        execute(
            tx,
            "UPDATE rlm.checkpoints SET parent_id = NULL WHERE id = $1",
            &[&id],
        )
        .await?;
    }
    let doomed = "SELECT id FROM rlm.checkpoints WHERE run_id = $1 AND id < $2";
    execute(
        tx,
        &format!("DELETE FROM rlm.writes WHERE checkpoint_id IN ({doomed})"),
        &[&run_id, &oldest_kept],
    )
    .await?;
    execute(
        tx,
        &format!("DELETE FROM rlm.snapshots WHERE checkpoint_id IN ({doomed})"),
        &[&run_id, &oldest_kept],
    )
    .await?;
    let removed = execute(
        tx,
        "DELETE FROM rlm.checkpoints WHERE run_id = $1 AND id < $2",
        &[&run_id, &oldest_kept],
    )
    .await?;
    report.removed = removed;
    Ok(report)
}
