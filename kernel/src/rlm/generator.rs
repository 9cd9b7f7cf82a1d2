//! The code generator: one root-model call per iteration, and the conversation it is built on.

use std::sync::Arc;

use bridge::{
    BridgeError, CallOptions, CancellationToken, ChatRequest, ChatResponse, Endpoint, Message,
    SubCallMetadata,
};

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
    /// The ledger's record of the call.
    pub record: Option<SubCallMetadata>,
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
        let ledger = self.endpoint.ledger();
        let first_index = ledger.next_call_index();
        let options = CallOptions {
            cancel: cancel.clone(),
            ..CallOptions::default()
        };
        let result = self.endpoint.call(request, &options).await;
        // Other callers may share the ledger; the root call is the first record of this
        // endpoint at or after the index taken before sending.
        let record = ledger
            .records_since(first_index)
            .into_iter()
            .find(|r| r.endpoint == self.endpoint.name() && !r.batched);
        Generation { result, record }
    }
}
