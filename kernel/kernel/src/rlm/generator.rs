//! The code generator: one root-model call per iteration, and the conversation it is built on.

use std::sync::Arc;

use bridge::{
    BridgeError, CallOptions, CancellationToken, ChatRequest, ChatResponse, Endpoint, Message,
    RecordedCall, SubCallMetadata,
};

/// How an elided feedback message starts.
const ELIDED_PREFIX: &str = "[Earlier feedback:";

/// The messages of a run: the system prompt, the first user message (context description and
/// query), then each reply and the feedback on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    messages: Vec<Message>,
}

impl Conversation {
    /// A conversation that starts with these two messages.
    pub fn new(system_prompt: impl Into<String>, first_message: impl Into<String>) -> Self {
        Self {
            messages: vec![Message::system(system_prompt), Message::user(first_message)],
        }
    }

    /// The messages so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Adds a model reply and the feedback on it.
    pub fn push_turn(&mut self, reply: impl Into<String>, feedback: impl Into<String>) {
        self.messages.push(Message::assistant(reply));
        self.messages.push(Message::user(feedback));
    }

    /// Appends text to the last user message (keeps roles alternating).
    pub fn append_to_last_user(&mut self, text: &str) {
        match self.messages.last_mut() {
            Some(last) if last.role == bridge::Role::User => {
                last.content.push_str("\n\n");
                last.content.push_str(text);
            }
            _ => self.messages.push(Message::user(text)),
        }
    }

    /// Keeps the conversation within `max_chars` characters by replacing the oldest feedback
    /// messages with a short marker; the system prompt, the first message, every reply and the
    /// feedback of the last two turns are always kept. Returns how many messages were elided.
    /// The model's variables stay in the session, so only what it was *shown* is dropped.
    pub fn fit(&mut self, max_chars: usize) -> usize {
        const KEEP_LAST_TURNS: usize = 2;
        let mut total: usize = self
            .messages
            .iter()
            .map(|m| m.content.chars().count())
            .sum();
        // Feedback messages are the user messages after the first one: 3, 5, 7, ...
        let last_elidable = self.messages.len().saturating_sub(2 * KEEP_LAST_TURNS);
        let mut elided = 0;
        for i in (3..last_elidable).step_by(2) {
            if total <= max_chars {
                break;
            }
            let message = &mut self.messages[i];
            if message.content.starts_with(ELIDED_PREFIX) {
                continue;
            }
            let before = message.content.chars().count();
            message.content = format!(
                "{ELIDED_PREFIX} {before} characters of output omitted to keep the conversation \
                 within {max_chars} characters; the variables it created are still in the session.]"
            );
            total = total - before + message.content.chars().count();
            elided += 1;
        }
        elided
    }

    /// The number of model replies in the conversation.
    pub fn turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| m.role == bridge::Role::Assistant)
            .count()
    }
}

/// A root-model call and the bridge's record of it, whatever the outcome.
#[derive(Debug)]
pub struct Generation {
    /// The response, or why there is none (after the bridge's retries).
    pub result: Result<ChatResponse, BridgeError>,
    /// The ledger's record of this call.
    pub record: SubCallMetadata,
}

/// Asks the root model for its next reply.
#[derive(Debug, Clone)]
pub struct CodeGenerator {
    endpoint: Arc<Endpoint>,
}

impl CodeGenerator {
    /// A generator calling `endpoint`.
    pub fn new(endpoint: Arc<Endpoint>) -> Self {
        Self { endpoint }
    }

    /// The root endpoint.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The request for the next reply (the endpoint's model and sampling defaults).
    pub fn request(&self, messages: &[Message]) -> ChatRequest {
        ChatRequest {
            messages: messages.to_vec(),
            ..ChatRequest::default()
        }
    }

    /// Sends `request` (limiter, budget, retries and accounting are the bridge's).
    pub async fn generate(&self, request: ChatRequest, cancel: &CancellationToken) -> Generation {
        let options = CallOptions {
            cancel: cancel.clone(),
            iteration: true,
            ..CallOptions::default()
        };
        let RecordedCall { result, record, .. } =
            self.endpoint.call_recorded(request, &options).await;
        Generation { result, record }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(turns: usize, feedback_chars: usize) -> Conversation {
        let mut c = Conversation::new("system", "query");
        for i in 0..turns {
            c.push_turn(format!("reply {i}"), "x".repeat(feedback_chars));
        }
        c
    }

    fn size(c: &Conversation) -> usize {
        c.messages().iter().map(|m| m.content.chars().count()).sum()
    }

    #[test]
    fn fit_elides_the_oldest_feedback_first_and_keeps_the_rest() {
        let mut c = conversation(6, 1_000);
        let untouched = c.clone();
        assert_eq!(c.fit(1_000_000), 0, "within the limit: nothing changes");
        assert_eq!(c, untouched);

        let elided = c.fit(3_000);
        assert!(size(&c) <= 3_000, "{}", size(&c));
        assert_eq!(elided, 4);
        let m = c.messages();
        assert!(
            m[3].content.starts_with(ELIDED_PREFIX),
            "oldest feedback elided"
        );
        assert!(m[3].content.contains("1000 characters"));
        // System prompt, first message, every reply and the last two feedbacks are kept.
        assert_eq!(
            (m[0].content.as_str(), m[1].content.as_str()),
            ("system", "query")
        );
        for (i, message) in m.iter().enumerate().skip(2).step_by(2) {
            assert_eq!(message.content, format!("reply {}", (i - 2) / 2));
        }
        assert_eq!(m[m.len() - 1].content.len(), 1_000);
        assert_eq!(m[m.len() - 3].content.len(), 1_000);
        assert_eq!(c.turns(), 6);
    }

    #[test]
    fn fit_stops_when_nothing_is_left_to_elide() {
        let mut c = conversation(2, 10_000);
        assert_eq!(c.fit(100), 0, "the last two turns are always kept");
        let mut c = conversation(4, 10_000);
        assert_eq!(c.fit(100), 2);
        assert_eq!(c.fit(100), 0, "already elided messages are left alone");
    }
}
