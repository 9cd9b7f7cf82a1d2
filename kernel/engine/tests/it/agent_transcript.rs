//! The JSONL transcript hook.

use std::io::{self, Write};
use std::sync::Arc;

use bridge::secret::{self, Secret};
use bridge::{CancellationToken, Message};
use engine::SharedState;
use engine::agent::{LoopConfig, LoopErrorKind, TranscriptWriter};
use serde_json::{Value, json};

use crate::agent_support::{Add, agent, mock};

#[tokio::test]
async fn every_message_is_a_flushed_redacted_line_then_the_result() {
    let key = Secret::new("sk-transcript-test-8d1f0c");
    secret::register(&key);
    let server = mock(json!([
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        "5"
    ]))
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("run.jsonl");
    let writer = Arc::new(TranscriptWriter::create(&path).expect("create"));
    let messages = vec![Message::user(format!(
        "Add 2 and 3; my key is {}",
        key.expose()
    ))];
    let outcome = agent(&server, vec![Arc::new(Add)], LoopConfig::default())
        .with_hook(writer.clone())
        .run(messages, SharedState::default(), CancellationToken::new())
        .await
        .expect("answered");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(!text.contains(key.expose()), "the key is redacted");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(writer.lines(), 5);
    let types: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(
        types,
        ["message", "message", "message", "message", "result"]
    );
    let iterations: Vec<u64> = lines[..4]
        .iter()
        .filter_map(|l| l["iteration"].as_u64())
        .collect();
    assert_eq!(iterations, [0, 1, 1, 2]);
    assert_eq!(lines[1]["message"]["tool_calls"][0]["name"], "add");
    assert_eq!(lines[2]["message"]["role"], "tool");
    assert_eq!(lines[2]["message"]["content"], "5");
    assert_eq!(lines[4]["answer"], "5");
    assert_eq!(lines[4]["termination"], "answered");
    assert_eq!(lines[4]["metrics"]["iterations"], 2);
    assert_eq!(outcome.run.transcript.len(), 4);
    server.shutdown().await;
}

/// Accepts `room` bytes, then fails.
struct Full {
    room: usize,
}

impl Write for Full {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() > self.room {
            return Err(io::Error::other("No space left on device"));
        }
        self.room -= buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_transcript_that_cannot_be_written_stops_the_run() {
    let server = mock(json!([
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        "5"
    ]))
    .await;
    let writer = Arc::new(TranscriptWriter::new(Full { room: 100 }));
    let error = agent(&server, vec![Arc::new(Add)], LoopConfig::default())
        .with_hook(writer.clone())
        .run(
            vec![Message::user("Add 2 and 3")],
            SharedState::default(),
            CancellationToken::new(),
        )
        .await
        .expect_err("stopped");
    assert_eq!(error.kind().name(), "stopped_by_hook");
    assert!(matches!(error.kind(), LoopErrorKind::StoppedByHook(_)));
    insta::assert_snapshot!(error.to_string(), @"A hook stopped the agent run: Could not write the transcript (No space left on device); check the disk and the path");
    assert_eq!(server.log().len(), 1, "the second model call was not made");
    server.shutdown().await;
}
