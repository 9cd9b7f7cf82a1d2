//! The process-wide tokio runtime.
//!
//! All network I/O of the kernel (sub-model calls made by `llm_query`, the RLM loop's root
//! calls, the CLI) runs on this one multi-threaded runtime; nobody builds a runtime per call.
//! Threads that are not runtime threads (the REPL's Python threads, the CLI's main thread)
//! wait on it with [`Runtime::block_on`](tokio::runtime::Runtime::block_on); code already
//! inside the runtime must `.await` instead.
//!
//! ```
//! let answer = kernel::runtime::shared().block_on(async { 40 + 2 });
//! assert_eq!(answer, 42);
//! ```

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

/// The process-wide multi-threaded tokio runtime (created on first use, never shut down).
pub fn shared() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        #[allow(clippy::expect_used)]
        Builder::new_multi_thread()
            .thread_name("rlm-runtime")
            .enable_all()
            .build()
            // Only fails when the OS refuses threads or an epoll fd at startup: nothing
            // the kernel could recover from.
            .expect("the operating system refused to start the tokio runtime")
    })
}
