//! A TCP fault proxy for live tests: put it between a client and a `redis-server` and break the link on
//! purpose while the test runs.
//!
//! Modes ([`ProxyMode`]) switch instantly for every open and future connection: forward normally, add
//! latency, blackhole (accept and never answer), or forward requests but drop the replies (the command runs,
//! the client never learns it). [`FaultProxy::reset`] closes every open connection.
//! [`FaultProxy::drop_next_messages`] loses pub/sub messages (a release notification) on their way to a
//! subscriber while everything else passes. Loopback only; plain std threads, so it works under any test
//! runtime.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the proxy treats traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Pass bytes through both ways.
    Forward,
    /// Hold every chunk of requests and replies this long before passing it on.
    Latency(Duration),
    /// Swallow requests and never answer (the server never sees them).
    Blackhole,
    /// Forward requests to the server but throw its replies away (applied, reply lost).
    DropReplies,
    /// Forward requests; throw away the next chunk of replies (one reply, for a client with one request in
    /// flight), close that connection (the link fails right after the server ran the command; a stream that
    /// silently lost bytes and carried on would mismatch later replies), and switch to the mode given to
    /// [`FaultProxy::lose_next_reply_then`] ([`Forward`](Self::Forward) when set with
    /// [`FaultProxy::set_mode`]).
    LoseNextReply,
    /// Unreachable: open connections are cut (at once when set with [`FaultProxy::set_mode`], at the lost reply
    /// after [`FaultProxy::lose_next_reply_then`]) and new ones are closed as soon as they are accepted, before
    /// anything reaches the server.
    Refuse,
}

struct Shared {
    mode: Mutex<ProxyMode>,
    /// Where new connections go.
    upstream: Mutex<SocketAddr>,
    /// The mode after [`ProxyMode::LoseNextReply`] lost its reply.
    after_lost_reply: Mutex<ProxyMode>,
    /// Set by [`FaultProxy::lose_reply_to_then`]: the request bytes that switch to
    /// [`ProxyMode::LoseNextReply`] when a request chunk contains them.
    lose_after: Mutex<Option<Vec<u8>>>,
    /// Request chunks swallowed by [`ProxyMode::Blackhole`].
    swallowed: AtomicU64,
    /// Reply chunks thrown away ([`ProxyMode::DropReplies`], [`ProxyMode::LoseNextReply`], blackhole).
    dropped: AtomicU64,
    /// Connections closed on accept by [`ProxyMode::Refuse`].
    refused: AtomicU64,
    streams: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
    accepted: AtomicU64,
    /// Pub/sub messages still to drop, and how many were dropped.
    drop_messages: AtomicU64,
    dropped_messages: AtomicU64,
}

impl Shared {
    fn mode(&self) -> ProxyMode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn upstream(&self) -> SocketAddr {
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn streams(&self) -> MutexGuard<'_, Vec<TcpStream>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Switches to [`ProxyMode::LoseNextReply`] if `request` contains the bytes armed by
    /// [`FaultProxy::lose_reply_to_then`].
    fn arm(&self, request: &[u8]) {
        let mut armed = self.lose_after.lock().unwrap_or_else(|p| p.into_inner());
        let hit = armed
            .as_deref()
            .is_some_and(|pattern| request.windows(pattern.len()).any(|w| w == pattern));
        if hit {
            *armed = None;
            *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = ProxyMode::LoseNextReply;
        }
    }
    /// In [`ProxyMode::LoseNextReply`], claims the one reply to lose and switches to the next mode; `false`
    /// when another connection claimed it first (the mode has changed since the chunk was read).
    fn claim_lost_reply(&self) -> bool {
        let mut mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
        if *mode != ProxyMode::LoseNextReply {
            return false;
        }
        *mode = *self
            .after_lost_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        true
    }
}

/// A running proxy from a free loopback port to `upstream`. Stops (closing every connection) on drop.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream())
            .field("mode", &self.shared.mode())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:<free port>` forwarding to `upstream`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: Mutex::new(ProxyMode::Forward),
            upstream: Mutex::new(upstream),
            after_lost_reply: Mutex::new(ProxyMode::Forward),
            lose_after: Mutex::new(None),
            swallowed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            streams: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            drop_messages: AtomicU64::new(0),
            dropped_messages: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("redlease-proxy-accept".into())
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(Self {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>` for the proxy's address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches every open and future connection to `mode`.
    pub fn set_mode(&self, mode: ProxyMode) {
        *self
            .shared
            .after_lost_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = ProxyMode::Forward;
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
        if mode == ProxyMode::Refuse {
            self.reset();
        }
    }

    /// Switches to [`ProxyMode::LoseNextReply`]: the next reply is thrown away (its request was applied) and
    /// its connection closed, and at that moment the proxy switches to `then` (e.g. [`ProxyMode::Refuse`], so
    /// that the client cannot reconnect until the test heals the link).
    pub fn lose_next_reply_then(&self, then: ProxyMode) {
        *self
            .shared
            .after_lost_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = then;
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) = ProxyMode::LoseNextReply;
    }

    /// Forwards everything until a request chunk contains `request` (e.g. `b"\r\nSET\r\n"`, a `SET`
    /// command), then switches to [`ProxyMode::LoseNextReply`] as
    /// [`lose_next_reply_then`](Self::lose_next_reply_then) does: the next reply, that request's for a client
    /// with one request in flight, is lost. For a call of several steps whose reply to lose is not the first.
    pub fn lose_reply_to_then(&self, request: &[u8], then: ProxyMode) {
        *self
            .shared
            .after_lost_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = then;
        *self
            .shared
            .lose_after
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(request.to_vec());
    }

    /// Request chunks swallowed by [`ProxyMode::Blackhole`] so far.
    pub fn swallowed_requests(&self) -> u64 {
        self.shared.swallowed.load(Ordering::SeqCst)
    }

    /// Connections closed on accept by [`ProxyMode::Refuse`] so far.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Reply chunks thrown away so far (any mode).
    pub fn dropped_replies(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.mode()
    }

    /// Sends new connections to `upstream` from now on and closes the open ones: what a load balancer or a
    /// floating address in front of a failover (or of a server replaced by another) does. The client sees
    /// its connection close, and whatever it reconnects to through the proxy is the new server.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = upstream;
        self.reset();
    }

    /// The server new connections go to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream()
    }

    /// Closes every open connection (client and server side). New connections are still accepted.
    pub fn reset(&self) {
        for s in self.shared.streams().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Drops the next `n` pub/sub messages (RESP3 `>` pushes and RESP2 arrays whose kind is `message`,
    /// `smessage` or `pmessage`) that any server sends to a client through the proxy, in whatever mode;
    /// every other reply passes. A subscriber connection that loses them stays up (what a lost
    /// notification looks like to a client).
    pub fn drop_next_messages(&self, n: u64) {
        self.shared.drop_messages.fetch_add(n, Ordering::SeqCst);
    }

    /// Pub/sub messages dropped so far by [`drop_next_messages`](Self::drop_next_messages).
    pub fn dropped_messages(&self) -> u64 {
        self.shared.dropped_messages.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.reset();
        // Wake the acceptor so it notices the stop flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(handle) = self.acceptor.take() {
            let _ = handle.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if shared.mode() == ProxyMode::Refuse {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&shared.upstream(), Duration::from_secs(2))
        else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let clones = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        );
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = clones else {
            continue;
        };
        shared.streams().extend([c3, s3]);
        let up = Arc::clone(&shared);
        let down = Arc::clone(&shared);
        let _ = std::thread::Builder::new()
            .name("redlease-proxy-up".into())
            .spawn(move || pump(client, server, &up, Direction::Request));
        let _ = std::thread::Builder::new()
            .name("redlease-proxy-down".into())
            .spawn(move || pump(s2, c2, &down, Direction::Reply));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

/// The length of the first complete RESP2/RESP3 frame in `buf`, `None` while it is incomplete.
fn frame_len(buf: &[u8]) -> Option<usize> {
    let line_end = |from: usize| {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let end = line_end(0)?;
    let header = std::str::from_utf8(buf.get(1..end)?).ok()?;
    let after = end + 2;
    match *buf.first()? {
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Some(after),
        b'$' | b'!' | b'=' => {
            let n: i64 = header.parse().ok()?;
            if n < 0 {
                return Some(after);
            }
            let total = after + usize::try_from(n).ok()? + 2;
            (buf.len() >= total).then_some(total)
        }
        kind @ (b'*' | b'~' | b'>' | b'%' | b'|') => {
            let n: i64 = header.parse().ok()?;
            if n < 0 {
                return Some(after);
            }
            let items = usize::try_from(n).ok()? * if matches!(kind, b'%' | b'|') { 2 } else { 1 };
            let mut at = after;
            for _ in 0..items {
                at += frame_len(buf.get(at..)?)?;
            }
            Some(at)
        }
        // Not RESP (an inline reply, or a test's raw bytes): pass everything as one frame.
        _ => Some(buf.len()),
    }
}

/// Whether a complete frame is a pub/sub message (push or RESP2 array of kind `message`/`smessage`/`pmessage`).
fn is_message(frame: &[u8]) -> bool {
    if !matches!(frame.first(), Some(b'>' | b'*')) {
        return false;
    }
    let Some(first) = frame.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    let rest = &frame[first + 2..];
    [
        &b"$7\r\nmessage\r\n"[..],
        b"$8\r\nsmessage\r\n",
        b"$8\r\npmessage\r\n",
    ]
    .iter()
    .any(|kind| rest.starts_with(kind))
}

/// Passes `chunk` on, minus the pub/sub messages still to be dropped; `held` keeps an incomplete frame
/// while dropping is on.
fn filter_messages(shared: &Shared, held: &mut Vec<u8>, chunk: &[u8]) -> Vec<u8> {
    if shared.drop_messages.load(Ordering::SeqCst) == 0 && held.is_empty() {
        return chunk.to_vec();
    }
    held.extend_from_slice(chunk);
    let mut out = Vec::with_capacity(held.len());
    let mut at = 0;
    while at < held.len() {
        if shared.drop_messages.load(Ordering::SeqCst) == 0 {
            out.extend_from_slice(&held[at..]);
            at = held.len();
            break;
        }
        let Some(len) = frame_len(&held[at..]) else {
            break;
        };
        let frame = &held[at..at + len];
        let claimed = is_message(frame)
            && shared
                .drop_messages
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if claimed {
            shared.dropped_messages.fetch_add(1, Ordering::SeqCst);
        } else {
            out.extend_from_slice(frame);
        }
        at += len;
    }
    held.drain(..at);
    out
}

fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, direction: Direction) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if direction == Direction::Request && shared.mode() == ProxyMode::Forward {
            shared.arm(&buf[..n]);
        }
        match (shared.mode(), direction) {
            (ProxyMode::Refuse, _) => break,
            (ProxyMode::Forward, _) => {}
            (ProxyMode::Latency(d), _) => std::thread::sleep(d),
            (ProxyMode::Blackhole, Direction::Request) => {
                shared.swallowed.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            (ProxyMode::Blackhole | ProxyMode::DropReplies, Direction::Reply) => {
                shared.dropped.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            (ProxyMode::DropReplies | ProxyMode::LoseNextReply, Direction::Request) => {}
            (ProxyMode::LoseNextReply, Direction::Reply) => {
                if shared.claim_lost_reply() {
                    shared.dropped.fetch_add(1, Ordering::SeqCst);
                    // The link goes down right after the server ran the command.
                    break;
                }
                // Claimed elsewhere meanwhile: this chunk is handled by the mode now in force.
                match shared.mode() {
                    ProxyMode::Refuse => break,
                    ProxyMode::Blackhole | ProxyMode::DropReplies => {
                        shared.dropped.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    ProxyMode::Latency(d) => std::thread::sleep(d),
                    _ => {}
                }
            }
        }
        let sent = if direction == Direction::Reply {
            let out = filter_messages(shared, &mut held, &buf[..n]);
            to.write_all(&out)
        } else {
            to.write_all(&buf[..n])
        };
        if sent.is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server standing in for Redis.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn roundtrip(stream: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(msg)?;
        let mut buf = vec![0u8; msg.len()];
        stream.read_exact(&mut buf)?;
        Ok(buf)
    }

    #[test]
    fn modes_switch_while_connected() {
        let proxy = FaultProxy::start(echo()).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(roundtrip(&mut c, b"ping").unwrap(), b"ping");

        proxy.set_mode(ProxyMode::Latency(Duration::from_millis(50)));
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut c, b"slow").unwrap(), b"slow");
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "latency both ways"
        );

        proxy.set_mode(ProxyMode::Blackhole);
        assert!(
            roundtrip(&mut c, b"void").is_err(),
            "no answer while blackholed"
        );

        proxy.set_mode(ProxyMode::DropReplies);
        assert!(roundtrip(&mut c, b"lost").is_err(), "the reply is dropped");

        proxy.set_mode(ProxyMode::Forward);
        let mut fresh = TcpStream::connect(proxy.addr()).unwrap();
        fresh
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(roundtrip(&mut fresh, b"back").unwrap(), b"back");
        assert_eq!(proxy.accepted(), 2);
    }

    /// A server that answers every read with `tag`.
    fn tagged(tag: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(tag).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn retarget_closes_open_connections_and_sends_new_ones_to_the_new_server() {
        let (a, b) = (tagged(b"A"), tagged(b"B"));
        let proxy = FaultProxy::start(a).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(roundtrip(&mut c, b"x").unwrap(), b"A");
        proxy.retarget(b);
        assert_eq!(proxy.upstream(), b);
        let mut buf = [0u8; 1];
        assert!(
            matches!(c.read(&mut buf), Ok(0) | Err(_)),
            "the open connection is closed"
        );
        let mut fresh = TcpStream::connect(proxy.addr()).unwrap();
        fresh
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        assert_eq!(roundtrip(&mut fresh, b"x").unwrap(), b"B");
    }

    #[test]
    fn lose_next_reply_loses_exactly_one_reply_then_switches_mode() {
        let proxy = FaultProxy::start(echo()).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        proxy.lose_next_reply_then(ProxyMode::Blackhole);
        assert!(roundtrip(&mut c, b"lost").is_err(), "the reply is lost");
        let mut buf = [0u8; 1];
        assert!(
            matches!(c.read(&mut buf), Ok(0) | Err(_)),
            "and its connection closed"
        );
        assert_eq!(proxy.mode(), ProxyMode::Blackhole);
        assert_eq!(
            (proxy.dropped_replies(), proxy.swallowed_requests()),
            (1, 0)
        );
        let mut d = TcpStream::connect(proxy.addr()).unwrap();
        d.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(roundtrip(&mut d, b"void").is_err(), "then blackholed");
        assert_eq!(proxy.swallowed_requests(), 1);
        // Set directly, it forwards after the one lost reply.
        proxy.set_mode(ProxyMode::LoseNextReply);
        let mut fresh = TcpStream::connect(proxy.addr()).unwrap();
        fresh
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(roundtrip(&mut fresh, b"gone").is_err());
        assert_eq!(proxy.mode(), ProxyMode::Forward);
        let mut again = TcpStream::connect(proxy.addr()).unwrap();
        again
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(roundtrip(&mut again, b"back").unwrap(), b"back");
    }

    #[test]
    fn refuse_cuts_open_connections_and_closes_new_ones() {
        let proxy = FaultProxy::start(echo()).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        proxy.lose_next_reply_then(ProxyMode::Refuse);
        assert!(roundtrip(&mut c, b"lost").is_err(), "the reply is lost");
        let mut buf = [0u8; 1];
        assert!(
            matches!(c.read(&mut buf), Ok(0) | Err(_)),
            "and the link cut"
        );
        let mut d = TcpStream::connect(proxy.addr()).unwrap();
        d.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        assert!(matches!(d.read(&mut buf), Ok(0) | Err(_)), "refused");
        assert_eq!(proxy.refused(), 1);
        proxy.set_mode(ProxyMode::Forward);
        let mut e = TcpStream::connect(proxy.addr()).unwrap();
        e.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        assert_eq!(roundtrip(&mut e, b"back").unwrap(), b"back");
    }

    #[test]
    fn resp_frames_are_measured_and_messages_recognised() {
        let push = b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n";
        assert_eq!(frame_len(push), Some(push.len()));
        assert!(is_message(push));
        assert_eq!(frame_len(&push[..push.len() - 1]), None, "incomplete");
        let reply = b"*2\r\n$3\r\nabc\r\n:5\r\n";
        assert_eq!(frame_len(reply), Some(reply.len()));
        assert!(!is_message(reply));
        assert_eq!(frame_len(b"%1\r\n+a\r\n:1\r\n"), Some(12));
        assert_eq!(frame_len(b"$-1\r\n+OK\r\n"), Some(5));
        let shared = Shared {
            mode: Mutex::new(ProxyMode::Forward),
            upstream: Mutex::new(SocketAddr::from(([127, 0, 0, 1], 1))),
            after_lost_reply: Mutex::new(ProxyMode::Forward),
            lose_after: Mutex::new(None),
            swallowed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            streams: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            drop_messages: AtomicU64::new(1),
            dropped_messages: AtomicU64::new(0),
        };
        // A message split over two reads, between two replies: only the message goes, once.
        let mut stream = b"+OK\r\n".to_vec();
        stream.extend_from_slice(push);
        stream.extend_from_slice(b":1\r\n");
        stream.extend_from_slice(push);
        let mut held = Vec::new();
        let mut out = filter_messages(&shared, &mut held, &stream[..9]);
        out.extend(filter_messages(&shared, &mut held, &stream[9..]));
        let mut expected = b"+OK\r\n:1\r\n".to_vec();
        expected.extend_from_slice(push);
        assert_eq!(out, expected);
        assert_eq!(shared.dropped_messages.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn reset_closes_open_connections() {
        let proxy = FaultProxy::start(echo()).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        assert_eq!(roundtrip(&mut c, b"x").unwrap(), b"x");
        proxy.reset();
        let mut buf = [0u8; 1];
        let closed = matches!(c.read(&mut buf), Ok(0) | Err(_));
        assert!(closed, "the connection was closed by the proxy");
    }
}
