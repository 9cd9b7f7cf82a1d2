//! [`HookAction`]: what a before-hook wants — the one answer of every hook and callback.
//!
//! Three loops take hooks: the function-calling loop ([`crate::agent::AgentHook`]), the
//! workflow callbacks around each agent, model call and tool call
//! ([`crate::flow::Callback`]), and the kernel's RLM loop. A before-point of any of them
//! answers with a `HookAction`: go on, replace the step's output with its own (the step is
//! skipped), or stop the run with a reason. Hooks run in order and the first that does not
//! continue decides ([`HookAction::first`]).
//!
//! ```
//! use engine::HookAction;
//!
//! let hooks: [fn(u32) -> HookAction<String>; 2] = [
//!     |_| HookAction::Continue,
//!     |n| if n > 2 { HookAction::Stop(format!("{n} is too many")) } else { HookAction::Continue },
//! ];
//! assert_eq!(HookAction::first(hooks.iter().map(|h| h(1))), HookAction::Continue);
//! assert_eq!(
//!     HookAction::first(hooks.iter().map(|h| h(3))),
//!     HookAction::Stop("3 is too many".to_owned())
//! );
//! ```

/// What a before-hook wants the loop to do.
#[derive(Debug, Clone, PartialEq)]
pub enum HookAction<T> {
    /// Go on as planned.
    Continue,
    /// Skip the step and use this as its output.
    Replace(T),
    /// End the run; the reason is reported as stopped by a hook.
    Stop(String),
}

impl<T> HookAction<T> {
    /// The first answer of `answers` that does not continue (asking no further), or
    /// [`Continue`](Self::Continue).
    pub fn first(answers: impl IntoIterator<Item = HookAction<T>>) -> Self {
        answers
            .into_iter()
            .find(|answer| !matches!(answer, Self::Continue))
            .unwrap_or(Self::Continue)
    }

    /// `Replace(value)` when there is a value, else `Continue`.
    pub fn replace_with(value: Option<T>) -> Self {
        value.map_or(Self::Continue, Self::Replace)
    }

    /// The replacement's value mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> HookAction<U> {
        match self {
            Self::Continue => HookAction::Continue,
            Self::Replace(value) => HookAction::Replace(f(value)),
            Self::Stop(reason) => HookAction::Stop(reason),
        }
    }
}
