//! The request log: one record per finished request, shared by the server and the test.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use serde::{Deserialize, Serialize};

/// One request as the server saw it. Times are monotonic, measured from server start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Arrival order, from 0 (every request, chat or not).
    pub id: u64,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Requested model (empty when the body did not name one or could not be parsed).
    pub model: String,
    /// When the request arrived (its headers read).
    pub arrived: Duration,
    /// The latency drawn for the request: it is answered no sooner than `arrived + latency`
    /// (zero when none was: a request refused first, or on a path the mock does not serve).
    #[serde(default)]
    pub latency: Duration,
    /// When the response was handed to the connection (after latency and faults).
    pub finished: Duration,
    /// HTTP status sent; `0` when the connection was dropped without a response (`reset`);
    /// `499` when the client went away before the response was ready (e.g. its timeout fired).
    pub status: u16,
    /// The injected fault, by [`super::FaultKind::name`].
    pub fault: Option<String>,
    /// Request body size in bytes.
    pub request_bytes: usize,
    /// Response body size in bytes as built (for `truncated_body`, the announced size).
    pub response_bytes: usize,
    /// The last user message, truncated to 200 characters.
    pub last_user: String,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// The request headers, with [`MockConfig::record_requests`](super::MockConfig::record_requests)
    /// (empty otherwise).
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The whole request body as text, with
    /// [`MockConfig::record_requests`](super::MockConfig::record_requests).
    #[serde(default)]
    pub body: Option<String>,
}

/// A cheap, cloneable handle on the server's request log.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    records: Arc<Mutex<VecDeque<RequestRecord>>>,
    pushed: Arc<Notify>,
    /// Keep at most this many records, dropping the oldest (`None` = keep all).
    limit: Option<usize>,
}

impl RequestLog {
    /// All records, in arrival (`id`) order.
    pub fn entries(&self) -> Vec<RequestRecord> {
        let mut entries: Vec<RequestRecord> = self.lock().iter().cloned().collect();
        entries.sort_by_key(|r| r.id);
        entries
    }

    /// Number of records held (finished requests, minus any dropped by the size limit).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no request has finished yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Forgets every record (ids keep counting).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The largest number of requests in flight at once: maximum overlap of the half-open
    /// intervals `[arrived, finished)`.
    pub fn max_concurrency(&self) -> usize {
        let mut events: Vec<(Duration, i8)> = {
            let records = self.lock();
            records
                .iter()
                .flat_map(|r| [(r.arrived, 1), (r.finished, -1)])
                .collect()
        };
        // At equal times a finish (-1) sorts before an arrival (+1): intervals are half-open.
        events.sort_unstable();
        let (mut current, mut max) = (0i64, 0i64);
        for (_, delta) in events {
            current += i64::from(delta);
            max = max.max(current);
        }
        usize::try_from(max).unwrap_or(0)
    }

    /// Waits until at least `n` records exist (records of requests whose client gave up can
    /// land a moment after the client saw its error); `false` if `timeout` passed first.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pushed = self.pushed.notified();
            if self.len() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, pushed).await.is_err() {
                return self.len() >= n;
            }
        }
    }

    /// A log that keeps at most `limit` records (`None` = all).
    pub(crate) fn with_limit(limit: Option<usize>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    pub(crate) fn push(&self, record: RequestRecord) {
        {
            let mut records = self.lock();
            if self.limit.is_some_and(|limit| records.len() >= limit) {
                records.pop_front();
            }
            records.push_back(record);
        }
        self.pushed.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<RequestRecord>> {
        // A panic while holding the lock cannot leave a Vec half-pushed; keep going.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}
