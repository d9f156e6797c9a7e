//! The temporary servers themselves, on real processes: a server that answers on our port but is not our child
//! is never accepted, and no server outlives its test process, however that process ends (SIGTERM, SIGKILL,
//! abort without unwinding).
//!
//! The lifetime tests re-run this test binary as a child process that starts a server and then waits to be
//! killed (`child_process_holds_a_server`, `#[ignore]`d so that it runs only when asked for by name, with
//! `REDLEASE_SERVER_CHILD` set).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlease_testkit::server::{RedisServer, find_redis_server, live_tests_enabled};

/// Set in the child process: how it ends once its server runs (`wait`, `abort`, `panic`).
const CHILD_ENV: &str = "REDLEASE_SERVER_CHILD";

/// How long a server may outlive its test process.
const OUTLIVE_BOUND: Duration = Duration::from_secs(5);

/// Whether `pid` is a live process (a zombie counts as gone: it holds no port and runs nothing).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A redis-server started directly (no testkit), killed on drop with its directory: a process of someone
/// else's on a port.
struct Foreign(Child, PathBuf);

impl Foreign {
    fn start(port: u16) -> Foreign {
        let dir = std::env::temp_dir().join(format!("redlease-foreign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(find_redis_server().unwrap())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let foreign = Foreign(child, dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the foreign server did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        foreign
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn process_id(info: &str) -> u32 {
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process_id in INFO server: {info}"))
}

#[test]
fn a_restart_never_accepts_a_foreign_server_that_took_the_port() {
    let test = "a_restart_never_accepts_a_foreign_server_that_took_the_port";
    let Some(mut server) = RedisServer::start_or_skip(test) else {
        return;
    };
    let port = server.port();
    server.kill();
    // Someone else's server takes the port in the restart window and answers PING.
    let foreign = Foreign::start(port);
    let restarted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.restart()));
    if let Err(panic) = &restarted {
        let message = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert!(
            message.contains(&format!("pid {}", foreign.0.id())),
            "restart() failed without naming the foreign server: {message}"
        );
    } else {
        // The old readiness check accepted any PONG: whoever answers now must be our own child.
        let answering = process_id(&server.cmd(&["INFO", "server"]));
        assert_eq!(
            Some(answering),
            server.pid(),
            "restart() accepted the foreign server (pid {}) on port {port} as ours",
            foreign.0.id()
        );
    }
}

/// What the child process reports: its server's pid and directory.
struct ChildServer {
    child: Child,
    server_pid: u32,
    dir: PathBuf,
}

fn start_child(ending: &str) -> ChildServer {
    let mut child = Command::new(std::env::current_exe().unwrap())
        // Its own process group, so that the group can be killed without this test.
        .process_group(0)
        .args([
            "--ignored",
            "--exact",
            "child_process_holds_a_server",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, ending)
        // The "abort" child waits for a line here before it aborts, so that its server is checked first.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // The harness prints `test child_process_holds_a_server ... ` before the report on the same line.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    // Reads the child's output to its end, so that it never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find("SERVER ") {
                let _ = tx.send(line[at..].to_owned());
            }
        }
    });
    let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child process did not report its server within 30 s");
    };
    let mut parts = line.split_whitespace().skip(1);
    let server_pid: u32 = parts.next().unwrap().parse().unwrap();
    let dir = PathBuf::from(parts.next().unwrap());
    assert!(
        alive(server_pid),
        "the child's server {server_pid} is not running"
    );
    assert!(
        dir.is_dir(),
        "the child's server dir {} is missing",
        dir.display()
    );
    if ending == "abort" {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
    }
    ChildServer {
        child,
        server_pid,
        dir,
    }
}

/// Ends the child with `signal` (sent to its process, or to its whole process group when `group`; nothing when
/// it ends by itself), then checks that its server and directory are gone within [`OUTLIVE_BOUND`].
fn assert_no_leak(mut c: ChildServer, signal: Option<&str>, group: bool) {
    if let Some(signal) = signal {
        let target = if group {
            format!("-{}", c.child.id())
        } else {
            c.child.id().to_string()
        };
        let status = Command::new("kill")
            .args([signal, "--", &target])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let status = c.child.wait().unwrap();
    assert!(!status.success(), "the child ended normally: {status}");
    let ended = Instant::now();
    while alive(c.server_pid) || c.dir.exists() {
        if ended.elapsed() > OUTLIVE_BOUND {
            let (running, present) = (alive(c.server_pid), c.dir.exists());
            // Do not leak it from here either.
            let _ = Command::new("kill")
                .args(["-KILL", &c.server_pid.to_string()])
                .status();
            let _ = std::fs::remove_dir_all(&c.dir);
            panic!(
                "{OUTLIVE_BOUND:?} after its test process ended ({status}), server {} running: {}, dir {} \
                 present: {}",
                c.server_pid,
                running,
                c.dir.display(),
                present
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "server {} and its dir gone {:?} after the test process ended ({status})",
        c.server_pid,
        ended.elapsed()
    );
}

#[test]
fn no_server_outlives_a_test_process_killed_with_sigterm() {
    if live_tests_enabled("no_server_outlives_a_test_process_killed_with_sigterm") {
        assert_no_leak(start_child("wait"), Some("-TERM"), false);
    }
}

#[test]
fn no_server_outlives_a_test_process_killed_with_sigkill() {
    if live_tests_enabled("no_server_outlives_a_test_process_killed_with_sigkill") {
        assert_no_leak(start_child("wait"), Some("-KILL"), false);
    }
}

#[test]
fn no_server_outlives_a_test_process_that_aborts_without_unwinding() {
    if live_tests_enabled("no_server_outlives_a_test_process_that_aborts_without_unwinding") {
        assert_no_leak(start_child("abort"), None, false);
    }
}

#[test]
fn no_server_outlives_a_test_process_whose_whole_process_group_is_killed() {
    // What a CI timeout or a supervisor does: SIGKILL to every process of the group at once.
    if live_tests_enabled("no_server_outlives_a_test_process_whose_whole_process_group_is_killed") {
        assert_no_leak(start_child("wait"), Some("-KILL"), true);
    }
}

/// Not a test on its own: the child process of the lifetime tests (run by name, with `REDLEASE_SERVER_CHILD`).
#[test]
#[ignore = "the child process of the lifetime tests; they run it"]
fn child_process_holds_a_server() {
    let Ok(ending) = std::env::var(CHILD_ENV) else {
        return;
    };
    let server = RedisServer::start();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "SERVER {} {}",
        server.pid().unwrap(),
        server.dir().display()
    )
    .unwrap();
    out.flush().unwrap();
    drop(out);
    match ending.as_str() {
        // Ends without unwinding: no destructor runs (like a test binary built with panic = "abort"). Only
        // once the parent has seen the server running (it writes a line when it has).
        "abort" => {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            std::process::abort()
        }
        _ => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
    }
}
