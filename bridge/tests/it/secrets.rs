//! Secrets: a key authenticates calls (retries included) and reaches the server only in its
//! auth header; no prompt carries a secret the process knows.

use bridge::mock::{FaultKind, FaultRule, Faults, MockConfig};
use bridge::{Budget, CallOptions, ChatRequest, EndpointConfig, Secret, secret};

use crate::support::{anthropic_config, endpoint, openai_config, start};

const KEY: &str = "sk-mock-key-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reaches_the_server_only_in_its_auth_header_and_survives_retries() {
    let server = start(MockConfig {
        api_key: Some(KEY.into()),
        record_requests: true,
        // Every client's first attempt fails: the retry must authenticate as well.
        faults: ["^sub-model$", "^claude-mock$"].into_iter().fold(
            Faults::none(),
            |faults, model| {
                faults.with_rule(FaultRule {
                    model: Some(model.into()),
                    ..FaultRule::matching("", FaultKind::ServerError).times(1)
                })
            },
        ),
        ..MockConfig::default()
    })
    .await;
    for config in [openai_config(&server), anthropic_config(&server)] {
        let config = EndpointConfig {
            api_key: Some(Secret::new(KEY)),
            ..config
        };
        let answer = endpoint(config, Budget::default())
            .call(
                ChatRequest::from_prompt(format!("echo this: {KEY}")),
                &CallOptions::default(),
            )
            .await
            .expect("authorized after a retry");
        // The mock echoes the prompt: the model got the prompt with the key redacted.
        assert_eq!(answer.content, "echo this: [redacted]");
        assert_eq!(answer.attempts, 2);
    }
    let log = server.log().entries();
    assert_eq!(log.len(), 4, "{log:?}");
    for record in &log {
        let body = record.body.as_deref().expect("bodies recorded");
        assert!(!body.contains(KEY), "{body}");
        let carrying: Vec<&str> = record
            .headers
            .iter()
            .filter(|(_, value)| value.contains(KEY))
            .map(|(name, _)| name.as_str())
            .collect();
        assert!(
            carrying == ["authorization"] || carrying == ["x-api-key"],
            "{carrying:?}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_secret_is_redacted_from_every_message() {
    let server = start(MockConfig {
        record_requests: true,
        ..MockConfig::default()
    })
    .await;
    let value = "db-password-registered-42";
    secret::register(&Secret::new(value));
    let mut request = ChatRequest::from_prompt(format!("password={value}"));
    request.messages.insert(0, bridge::Message::system(value));
    endpoint(openai_config(&server), Budget::default())
        .call(request, &CallOptions::default())
        .await
        .expect("answered");
    let body = server.log().entries()[0].body.clone().expect("recorded");
    assert!(!body.contains(value), "{body}");
    assert_eq!(body.matches("[redacted]").count(), 2, "{body}");
    server.shutdown().await;
}

#[tokio::test]
async fn headers_and_bodies_are_recorded_only_when_asked() {
    let server = start(MockConfig::default()).await;
    endpoint(openai_config(&server), Budget::default())
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect("answered");
    let record = &server.log().entries()[0];
    assert!(
        record.headers.is_empty() && record.body.is_none(),
        "{record:?}"
    );
    server.shutdown().await;
}
