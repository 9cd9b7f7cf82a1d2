//! The PostgreSQL layout and its version.
//!
//! The tables are the SQLite store's (`runs`, `checkpoints`, `writes`, `snapshots`,
//! `leases`; see `sqlite/schema.rs`) in a PostgreSQL schema of their own, `rlm`, so a shared
//! database keeps them apart from its other tables. A lease also has a heartbeat:
//! `renewed_ms` and `expires_ms`, both in the server's clock (`rlm.now_ms()`), so hosts whose
//! clocks disagree still agree on when a lease ran out. Values are JSON text, as in SQLite
//! (PostgreSQL compresses a long one on its own, out of line).
//!
//! The layout is the list of [`MIGRATIONS`], versioned as SQLite's: `rlm.schema_version`
//! holds the version, a database at version N runs the steps after N in one transaction, and
//! one newer than [`VERSION`] is refused. Opens that find the schema current only read the
//! version; an upgrade takes a transaction-level advisory lock first, so of two hosts opening
//! a new database at once, the second waits and finds the first one's schema.

/// The schema version this build writes and reads: one per migration.
pub(super) const VERSION: i64 = MIGRATIONS.len() as i64;

/// The steps from an empty database to the current layout; step N leads to version N + 1.
/// A step is never edited once released (databases ran it already): a change is a new step.
pub(super) const MIGRATIONS: [&str; 1] = [V1];

/// The advisory lock key an upgrade holds (`rlm_sche` in ASCII).
pub(super) const UPGRADE_LOCK: i64 = 0x726c_6d5f_7363_6865;

/// Whether the schema exists: what every open reads first.
pub(super) const EXISTS: &str = "SELECT to_regclass('rlm.schema_version') IS NOT NULL";

/// The schema's version, once it exists.
pub(super) const READ_VERSION: &str = "SELECT max(version) FROM rlm.schema_version";

/// What an upgrade runs before the steps: the namespace and its version table.
pub(super) const PREPARE: &str = "
CREATE SCHEMA IF NOT EXISTS rlm;
CREATE TABLE IF NOT EXISTS rlm.schema_version (version bigint NOT NULL);
";

/// Version 1: runs, checkpoints and their writes and snapshots, leases with a heartbeat, and
/// the server's clock in milliseconds.
const V1: &str = "
CREATE FUNCTION rlm.now_ms() RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;
CREATE TABLE rlm.runs (
    run_id      text PRIMARY KEY,
    workflow    text NOT NULL,
    status      text NOT NULL,
    detail      text,
    input       text NOT NULL,
    head        bigint,
    created_ms  bigint NOT NULL,
    updated_ms  bigint NOT NULL
);
CREATE TABLE rlm.checkpoints (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text NOT NULL REFERENCES rlm.runs(run_id),
    parent_id   bigint,
    step        bigint NOT NULL,
    node        text NOT NULL,
    next        text NOT NULL,
    metadata    text NOT NULL,
    created_ms  bigint NOT NULL,
    write_bytes bigint NOT NULL,
    chain_bytes bigint NOT NULL,
    chain_len   bigint NOT NULL,
    base_bytes  bigint NOT NULL
);
CREATE INDEX checkpoints_by_run ON rlm.checkpoints(run_id, id);
CREATE TABLE rlm.writes (
    checkpoint_id bigint NOT NULL,
    seq           integer NOT NULL,
    key           text NOT NULL,
    op            text NOT NULL,
    value         text,
    PRIMARY KEY (checkpoint_id, seq)
);
CREATE TABLE rlm.snapshots (
    checkpoint_id bigint PRIMARY KEY,
    state         text NOT NULL,
    versions      text NOT NULL
);
CREATE TABLE rlm.leases (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text NOT NULL UNIQUE,
    pid         bigint NOT NULL,
    host        text NOT NULL,
    started     text NOT NULL,
    claimed_ms  bigint NOT NULL,
    renewed_ms  bigint NOT NULL,
    expires_ms  bigint NOT NULL
);
";
