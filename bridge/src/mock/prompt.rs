//! What the server reads from one chat request, whatever its wire format.

/// What the server knows about one chat request, borrowed from the parsed body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prompt<'a> {
    pub(crate) model: &'a str,
    pub(crate) system: &'a str,
    pub(crate) last_user: &'a str,
    /// Number of assistant messages in the request.
    pub(crate) turn: u64,
}
