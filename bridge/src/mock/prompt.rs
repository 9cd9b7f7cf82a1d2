//! What the server reads from one chat request, whatever its wire format.

/// What the server knows about one chat request, borrowed from the parsed body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prompt<'a> {
    pub(crate) model: &'a str,
    pub(crate) system: &'a str,
    pub(crate) last_user: &'a str,
    /// The content of the most recent tool result, if the request has one.
    pub(crate) last_tool: Option<&'a str>,
    /// The function name of the call that result answers (empty without one).
    pub(crate) tool_name: &'a str,
    /// Number of assistant messages in the request.
    pub(crate) turn: u64,
}
