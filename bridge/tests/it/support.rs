//! Shared helpers: start a mock server, build endpoints pointing at it.

use std::sync::Arc;
use std::time::Duration;

use bridge::mock::{Faults, Latency, MockConfig, MockServer, Script};
use bridge::{Budget, Endpoint, EndpointConfig, Ledger, RetryPolicy};

/// Start a mock server with `config`.
pub(crate) async fn start(config: MockConfig) -> MockServer {
    MockServer::start(config).await.expect("mock server starts")
}

/// Start an echoing mock server with `latency` and `faults`.
pub(crate) async fn start_with(latency: Latency, faults: Faults) -> MockServer {
    start(MockConfig {
        latency,
        faults,
        ..MockConfig::default()
    })
    .await
}

/// Start a mock server running `script` (JSON).
pub(crate) async fn start_script(script: &str) -> MockServer {
    start(MockConfig {
        script: Script::from_json_str(script).expect("valid script"),
        ..MockConfig::default()
    })
    .await
}

/// Quick retries so tests that exercise them stay fast.
pub(crate) fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_secs(5),
        ..RetryPolicy::default()
    }
}

/// An OpenAI endpoint named `sub` on `server`.
pub(crate) fn openai_config(server: &MockServer) -> EndpointConfig {
    EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: fast_retry(3),
        max_in_flight: 512,
        ..EndpointConfig::openai("sub", server.openai_base_url(), "sub-model")
    }
}

/// An Anthropic endpoint named `root` on `server`.
pub(crate) fn anthropic_config(server: &MockServer) -> EndpointConfig {
    EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: fast_retry(3),
        ..EndpointConfig::anthropic("root", server.anthropic_base_url(), "claude-mock")
    }
}

/// An endpoint for `config` with its own ledger enforcing `budget`.
pub(crate) fn endpoint(config: EndpointConfig, budget: Budget) -> Endpoint {
    Endpoint::new(config, Arc::new(Ledger::new(budget))).expect("valid endpoint config")
}

/// What a [`raw_server`] does after writing its canned reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterReply {
    /// Close the connection (the reply is complete).
    Close,
    /// Keep the connection open without writing more (a body shorter than announced).
    Stall,
}

/// A bare HTTP/1.1 server on 127.0.0.1 answering every request with the same bytes, for
/// replies the mock cannot produce. Returns an OpenAI-style base URL (`http://…/v1`).
pub(crate) async fn raw_server(reply: impl Into<Vec<u8>>, after: AfterReply) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let reply: Arc<[u8]> = reply.into().into();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let reply = Arc::clone(&reply);
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                if read_request(&mut socket).await.is_none() {
                    return;
                }
                if socket.write_all(&reply).await.is_err() {
                    return;
                }
                match after {
                    AfterReply::Close => {
                        let _ = socket.shutdown().await;
                    }
                    AfterReply::Stall => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    format!("http://{addr}/v1")
}

/// Read one request (headers and a `Content-Length` body); `None` if the client left.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<()> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return Some(());
            }
        }
    }
}

/// A complete HTTP/1.1 response with `Content-Length` and `Connection: close`.
pub(crate) fn http_reply(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut reply = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in headers {
        reply.push_str(&format!("{name}: {value}\r\n"));
    }
    reply.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    reply
}

/// An OpenAI endpoint named `sub` at `base_url` with `max_attempts` quick attempts.
pub(crate) fn raw_config(base_url: &str, max_attempts: u32) -> EndpointConfig {
    EndpointConfig {
        timeout: Duration::from_secs(10),
        retry: fast_retry(max_attempts),
        ..EndpointConfig::openai("sub", base_url, "m")
    }
}
