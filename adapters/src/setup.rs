//! What the adapters' URL and timeout constructors share: [`Timeouts`] and [`SetupError`].

use std::time::Duration;

use redlease::{Config, ConfigError};

/// A client's connection timeout and response timeout, for the constructors that take them
/// (`MultiplexedNode::connect_with_timeouts`, `LazyNode::with_timeouts`, `ManagedNode::connect_with_timeouts`,
/// `ClientNode::from_url`, and the URL managers, which use [`Timeouts::for_config`]).
///
/// - **connection**: how long opening a connection may take, so that an unreachable server fails fast and
///   definitely (nothing was sent). Keep it at most the operation timeout.
/// - **response**: how long the client waits for a reply. A response timeout is an *ambiguous* error (the
///   command may have run), which redlease treats as one. About the operation timeout.
///
/// ```
/// use std::time::Duration;
/// use redlease::Config;
/// use redlease_adapters::Timeouts;
///
/// let timeouts = Timeouts::new(Duration::from_millis(300), Duration::from_millis(500))?;
/// assert_eq!(timeouts.connection(), Duration::from_millis(300));
///
/// // Both the operation timeout of the config's default expiry: min(30 s / 5, 500 ms).
/// let timeouts = Timeouts::for_config(&Config::default())?;
/// assert_eq!(timeouts.response(), Duration::from_millis(500));
///
/// assert!(Timeouts::new(Duration::ZERO, Duration::from_millis(500)).is_err());
/// # Ok::<(), redlease_adapters::SetupError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timeouts {
    connection: Duration,
    response: Duration,
}

impl Timeouts {
    /// A connection timeout and a response timeout.
    ///
    /// # Errors
    /// [`SetupError::ZeroTimeout`] if either is zero (every connection or every command would fail).
    pub fn new(connection: Duration, response: Duration) -> Result<Self, SetupError> {
        if connection.is_zero() {
            return Err(SetupError::ZeroTimeout {
                which: "connection",
            });
        }
        if response.is_zero() {
            return Err(SetupError::ZeroTimeout { which: "response" });
        }
        Ok(Self {
            connection,
            response,
        })
    }

    /// The operation timeout that `config` applies to its default expiry (the bound redlease puts on every
    /// round of node calls) as the connection timeout, and as the response timeout that plus the durability
    /// policy's wait, if any: a `WAIT` may take that long (redlease allows a round the operation timeout plus
    /// the wait), and a response timeout shorter than it would cut the `WAIT` into an ambiguous error.
    ///
    /// # Errors
    /// [`SetupError::Config`] if `config` is invalid.
    pub fn for_config(config: &Config) -> Result<Self, SetupError> {
        config.validate()?;
        let timeout = config.operation_timeout_for(config.expiry());
        let wait = config
            .durability()
            .wait()
            .map_or(std::time::Duration::ZERO, |w| w.timeout);
        Self::new(timeout, timeout.saturating_add(wait))
    }

    /// The connection timeout.
    pub fn connection(&self) -> Duration {
        self.connection
    }

    /// The response timeout.
    pub fn response(&self) -> Duration {
        self.response
    }
}

/// Why a node or manager could not be built. Raised before anything is sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A URL the client cannot parse. `url` is the URL with anything that may be a credential replaced by
    /// `***`.
    #[error("node {index}: invalid Redis URL `{url}`: {reason}")]
    Url {
        /// The URL's position in the list (0 for a single URL).
        index: usize,
        /// The URL, credentials masked.
        url: String,
        /// What the client said about it.
        reason: String,
    },
    /// A timeout of zero.
    #[error("the {which} timeout must be greater than zero")]
    ZeroTimeout {
        /// `"connection"` or `"response"`.
        which: &'static str,
    },
    /// The configuration or the topology is invalid (for example two URLs naming one server in Redlock).
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl SetupError {
    /// A [`SetupError::Url`] for `url` at `index`, with the client's `reason` (whose own text is masked too,
    /// in case it quotes the URL).
    #[cfg_attr(not(any(feature = "redis", feature = "fred")), allow(dead_code))]
    pub(crate) fn url(index: usize, url: &str, reason: impl std::fmt::Display) -> Self {
        let masked = mask(url);
        let mut reason = reason.to_string();
        if !url.is_empty() && reason.contains(url) {
            reason = reason.replace(url, &masked);
        }
        Self::Url {
            index,
            url: masked,
            reason,
        }
    }
}

/// `url` with everything between the scheme and the last `@` (user name and password) replaced by `***`.
/// Conservative for malformed URLs: the last `@` of the whole string ends the masked part.
pub(crate) fn mask(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let start = url.find("://").map_or(0, |i| i + 3).min(at);
    format!("{}***{}", &url[..start], &url[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_hides_user_and_password_also_in_malformed_urls() {
        assert_eq!(mask("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(mask("redis://u:s3cret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(mask("redis://:pa/ss@w@rd@h"), "redis://***@h");
        assert_eq!(mask("u:s3cret@h"), "***@h");
    }

    #[test]
    fn a_url_error_names_the_node_and_masks_credentials_in_the_reason_too() {
        let url = "redis://u:s3cret@h:x";
        let err = SetupError::url(2, url, format!("cannot parse {url}"));
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            err.to_string().starts_with("node 2: invalid Redis URL"),
            "{err}"
        );
    }

    #[test]
    fn zero_timeouts_are_refused() {
        let ms = Duration::from_millis(1);
        assert!(matches!(
            Timeouts::new(Duration::ZERO, ms),
            Err(SetupError::ZeroTimeout {
                which: "connection"
            })
        ));
        assert!(matches!(
            Timeouts::new(ms, Duration::ZERO),
            Err(SetupError::ZeroTimeout { which: "response" })
        ));
        assert!(matches!(
            Timeouts::for_config(&Config::default().with_operation_timeout(Duration::ZERO)),
            Err(SetupError::Config(_))
        ));
    }
}
