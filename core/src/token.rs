//! Ownership tokens.

use std::fmt;

/// Number of random bytes in a [`Token`].
pub const TOKEN_BYTES: usize = 20;

/// The random ownership token of one acquisition.
///
/// 20 bytes (160 bits) from the operating system's CSPRNG, hex-encoded into 40 lowercase characters. One token
/// identifies one acquisition (not a process or a host); a Redlock acquisition writes the same token to every
/// node, and retries of the same acquisition reuse it so that they recognise their own earlier writes.
///
/// A token is a capability: whoever knows it can release or extend the lease. `Debug` and `Display` therefore
/// show only its first four characters (`Token(1a2b…)`); [`Token::as_str`] gives the full text to nodes.
///
/// A lock with [holder info](crate::Lock::with_holder_info) stores it after the hex digits, separated by a
/// `:` (`1a2b…:host=web-1 pid=42`): the info is then written, expires and is deleted with the lock in the
/// same atomic steps, and every compare-and-delete or compare-and-expire compares the whole value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token {
    // Inline rather than a `String`: every held lease keeps one, and thousands may be held at once.
    hex: [u8; TOKEN_BYTES * 2],
    /// The whole value with holder info (`hex:info`), if the lock has any.
    value: Option<Box<str>>,
}

impl Token {
    /// Draws a fresh token from the operating system's random number generator.
    ///
    /// # Errors
    /// [`TokenError`] when the operating system cannot supply randomness (for example a sandbox without
    /// `getrandom(2)` before the entropy pool is ready). No fallback to weaker randomness is attempted.
    pub fn random() -> Result<Self, TokenError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| TokenError {
            message: e.to_string(),
        })?;
        let mut hex = [0u8; TOKEN_BYTES * 2];
        hex::encode_to_slice(bytes, &mut hex).map_err(|e| TokenError {
            message: e.to_string(),
        })?;
        Ok(Self { hex, value: None })
    }

    /// This token with `info` stored after it (see [holder info](crate::Lock::with_holder_info)).
    pub(crate) fn with_info(mut self, info: Option<&str>) -> Self {
        self.value = info.map(|info| format!("{}:{info}", self.hex_str()).into_boxed_str());
        self
    }

    /// The 40 hexadecimal digits alone.
    pub(crate) fn hex_str(&self) -> &str {
        // Always ASCII hex digits, written by `hex::encode_to_slice` or checked by `from_hex`.
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }

    /// The holder info stored with this token, if any.
    pub fn info(&self) -> Option<&str> {
        self.value
            .as_deref()
            .and_then(|v| v.get(TOKEN_BYTES * 2 + 1..))
    }

    /// The holder info in a lock's stored value (`None` when the value is no token of ours or has no info).
    /// Never returns the token itself.
    pub(crate) fn info_in(value: &[u8]) -> Option<&str> {
        let (hex, rest) = value.split_at_checked(TOKEN_BYTES * 2)?;
        if !hex
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return None;
        }
        std::str::from_utf8(rest.strip_prefix(b":")?).ok()
    }

    /// A token from its 40-character lowercase hexadecimal text (a [`LeaseTicket`](crate::LeaseTicket)'s);
    /// `None` for anything else.
    pub(crate) fn from_hex(text: &str) -> Option<Self> {
        let hex: [u8; TOKEN_BYTES * 2] = text.as_bytes().try_into().ok()?;
        hex.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .then_some(Self { hex, value: None })
    }

    /// The full text as stored in Redis: the 40 hexadecimal digits, and the holder info if the lock has any.
    pub fn as_str(&self) -> &str {
        match &self.value {
            Some(value) => value,
            None => self.hex_str(),
        }
    }

    /// Whether a value read back from Redis is this token.
    pub fn matches(&self, value: &[u8]) -> bool {
        self.as_str().as_bytes() == value
    }

    /// A short, non-secret prefix for logs and error messages.
    pub fn redacted(&self) -> &str {
        self.hex_str().get(..4).unwrap_or("")
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", self.redacted())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.redacted())
    }
}

/// The operating system could not supply random bytes for a [`Token`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("the operating system random number generator failed: {message}")]
pub struct TokenError {
    message: String,
}

#[cfg(test)]
impl TokenError {
    /// A token error with `message`, for the error-message tests.
    pub(crate) fn for_tests(message: &str) -> Self {
        Self {
            message: message.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_forty_lowercase_hex_characters() {
        let token = Token::random().unwrap();
        assert_eq!(token.as_str().len(), 40);
        assert!(
            token
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    /// Only uniqueness within one process (a seeded generator would pass this too); that tokens come from the
    /// OS and differ across processes is `tokens_differ_across_processes_and_every_bit_is_unbiased`.
    #[test]
    fn a_hundred_thousand_tokens_in_one_process_never_repeat() {
        let mut seen = HashSet::with_capacity(100_000);
        for _ in 0..100_000 {
            assert!(seen.insert(Token::random().unwrap().as_str().to_owned()));
        }
    }

    #[test]
    fn debug_and_display_never_print_the_whole_token() {
        let token = Token::random().unwrap();
        let debug = format!("{token:?}");
        let display = format!("{token}");
        assert!(!debug.contains(token.as_str()));
        assert!(!display.contains(token.as_str()));
        assert!(debug.contains(token.redacted()));
    }

    #[test]
    fn matches_compares_the_full_value() {
        let token = Token::random().unwrap();
        assert!(token.matches(token.as_str().as_bytes()));
        assert!(!token.matches(&token.as_str().as_bytes()[..39]));
        assert!(!token.matches(Token::random().unwrap().as_str().as_bytes()));
    }
}
