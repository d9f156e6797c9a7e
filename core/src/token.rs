//! Ownership tokens.

use std::fmt;

/// Number of random bytes in a [`Token`].
pub const TOKEN_BYTES: usize = 20;

/// The random ownership token of one acquisition.
///
/// 20 bytes (160 bits) of ChaCha20 keyed from the operating system's CSPRNG ([`Token::random`]), hex-encoded
/// into 40 lowercase characters. One token identifies one acquisition (not a process or a host); a Redlock
/// acquisition writes the same token to every node, and retries of the same acquisition reuse it so that they recognise their own earlier writes.
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
    /// Draws a fresh token: the first 20 bytes of a new ChaCha20 block whose 256-bit key comes from the
    /// operating system's random number generator (one key per thread, replaced after 1024 blocks), the way
    /// user-space CSPRNGs such as `rand`'s `ThreadRng` work; one token costs a fraction of a `getrandom(2)`
    /// call.
    ///
    /// **Across `fork()`**: the child inherits the generator's state, so every token compares the process id
    /// the key was drawn in with the current one and draws a new key from the OS when they differ — before
    /// the child's first token. (Only the thread that forked exists in a child, and its state is the one
    /// checked.) Nothing is buffered between tokens, and as a second guard against a recycled process id
    /// each block's nonce holds the monotonic clock's reading in nanoseconds.
    ///
    /// # Errors
    /// [`TokenError`] when the operating system cannot supply randomness (for example a sandbox without
    /// `getrandom(2)` before the entropy pool is ready). No fallback to weaker randomness is attempted.
    pub fn random() -> Result<Self, TokenError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        generator::fill(&mut bytes).map_err(|e| TokenError {
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

/// A per-thread ChaCha20 keystream keyed from the OS, re-keyed after `fork()` (see [`Token::random`]).
mod generator {
    use std::cell::RefCell;
    use std::sync::OnceLock;
    use std::time::Instant;

    /// Blocks (tokens) drawn with one key before a new key is taken from the OS.
    const BLOCKS_PER_KEY: u32 = 1024;

    /// The ChaCha constants ("expand 32-byte k").
    const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

    struct State {
        /// The process the key was drawn in.
        pid: u32,
        key: [u32; 8],
        /// Blocks produced with this key (the block counter).
        blocks: u32,
    }

    thread_local! {
        // No destructor (plain arrays), so it stays usable while other thread-locals are destroyed.
        static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
    }

    /// The clock origin of the per-block nonce (a reading needs no system call on Linux: vDSO).
    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    fn quarter(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    }

    /// One ChaCha20 block (RFC 8439's layout: 32-bit counter, 96-bit nonce).
    pub(super) fn block(key: &[u32; 8], counter: u32, nonce: [u32; 3]) -> [u8; 64] {
        let mut input = [0u32; 16];
        input[..4].copy_from_slice(&SIGMA);
        input[4..12].copy_from_slice(key);
        input[12] = counter;
        input[13..].copy_from_slice(&nonce);
        let mut x = input;
        for _ in 0..10 {
            quarter(&mut x, 0, 4, 8, 12);
            quarter(&mut x, 1, 5, 9, 13);
            quarter(&mut x, 2, 6, 10, 14);
            quarter(&mut x, 3, 7, 11, 15);
            quarter(&mut x, 0, 5, 10, 15);
            quarter(&mut x, 1, 6, 11, 12);
            quarter(&mut x, 2, 7, 8, 13);
            quarter(&mut x, 3, 4, 9, 14);
        }
        let mut out = [0u8; 64];
        for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&x[i].wrapping_add(input[i]).to_le_bytes());
        }
        out
    }

    impl State {
        fn seeded(pid: u32) -> Result<Self, getrandom::Error> {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed)?;
            let mut key = [0u32; 8];
            for (k, chunk) in key.iter_mut().zip(seed.chunks_exact(4)) {
                let mut word = [0u8; 4];
                word.copy_from_slice(chunk);
                *k = u32::from_le_bytes(word);
            }
            seed.fill(0);
            Ok(Self {
                pid,
                key,
                blocks: 0,
            })
        }

        /// The first `out.len()` (at most 64) bytes of a new block. Nothing is buffered: a block that was
        /// drawn before a `fork()` is never handed out again.
        fn take(&mut self, out: &mut [u8]) {
            let nanos = origin().elapsed().as_nanos();
            // The clock and the process id as the nonce: equal keys after a `fork()` whose child was not
            // re-keyed (a recycled process id) still give different blocks unless read in the same ns.
            let nonce = [nanos as u32, (nanos >> 32) as u32, self.pid];
            let mut block = block(&self.key, self.blocks, nonce);
            self.blocks += 1;
            let n = out.len().min(block.len());
            out[..n].copy_from_slice(&block[..n]);
            block.fill(0);
        }
    }

    /// Fills `out` (a token's bytes, at most 64) from this thread's generator, re-keyed first when the
    /// process changed (a `fork()`) or the key has produced [`BLOCKS_PER_KEY`] blocks.
    pub(super) fn fill(out: &mut [u8]) -> Result<(), getrandom::Error> {
        let pid = std::process::id();
        let drawn = STATE.try_with(|cell| -> Result<bool, getrandom::Error> {
            let Ok(mut state) = cell.try_borrow_mut() else {
                return Ok(false);
            };
            let stale = match &*state {
                Some(s) => s.pid != pid || s.blocks >= BLOCKS_PER_KEY,
                None => true,
            };
            if stale {
                *state = Some(State::seeded(pid)?);
            }
            match &mut *state {
                Some(s) if out.len() <= 64 => {
                    s.take(out);
                    Ok(true)
                }
                _ => Ok(false),
            }
        });
        match drawn {
            Ok(Ok(true)) => Ok(()),
            Ok(Err(e)) => Err(e),
            // The thread is being torn down (or re-entered): straight from the OS.
            Ok(Ok(false)) | Err(_) => getrandom::fill(out),
        }
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

    /// RFC 8439 section 2.3.2's test vector for the ChaCha20 block function.
    #[test]
    fn the_generator_computes_chacha20_blocks_as_rfc_8439_does() {
        let key: [u32; 8] = std::array::from_fn(|i| {
            let b = (4 * i) as u8;
            u32::from_le_bytes([b, b + 1, b + 2, b + 3])
        });
        let nonce = [0x0900_0000, 0x4a00_0000, 0];
        let out = generator::block(&key, 1, nonce);
        assert_eq!(
            hex::encode(out),
            "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e\
             d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
        );
    }

    /// Every bit of 20,000 tokens drawn on four threads is set in about half of them (a stuck or biased
    /// keystream bit would not be), and no two repeat.
    #[test]
    fn generated_tokens_are_unbiased_and_distinct_across_threads() {
        let tokens: Vec<Token> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..5_000)
                            .map(|_| Token::random().unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        let distinct: HashSet<&str> = tokens.iter().map(Token::as_str).collect();
        assert_eq!(distinct.len(), tokens.len());
        let n = tokens.len() as f64;
        for bit in 0..TOKEN_BYTES * 8 {
            let ones = tokens
                .iter()
                .filter(|t| {
                    let byte =
                        u8::from_str_radix(&t.as_str()[bit / 8 * 2..bit / 8 * 2 + 2], 16).unwrap();
                    byte >> (bit % 8) & 1 == 1
                })
                .count() as f64;
            // Binomial(20000, 0.5): sd 70.7; six sd is a false alarm about once in 10^9 bits.
            assert!(
                (ones - n / 2.0).abs() < 6.0 * (n / 4.0).sqrt(),
                "bit {bit}: {ones} of {n}"
            );
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
