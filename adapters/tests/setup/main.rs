//! The front door on real servers the tests start: which client runs on which runtime (`runtimes`), and the
//! constructors that take timeouts or URLs (`urls`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod runtimes;
mod urls;

/// The full chain of messages of an error.
#[allow(dead_code)]
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(" <- ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
