//! Running `redlease-worker` processes from tests and reading their reports.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// A worker process; killed (SIGKILL, after SIGCONT in case it is stopped) when dropped.
pub(crate) struct Worker {
    pub(crate) name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every line read so far.
    pub(crate) seen: Vec<String>,
}

impl Worker {
    /// Starts the worker binary with `args` (`["--role", "contend", …]`).
    pub(crate) fn spawn(name: &str, args: &[&str]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_redlease-worker"))
            .args(args)
            .args(["--id", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn worker {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            name: name.to_owned(),
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `kill -<signal>` to the worker.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Writes one line to the worker's stdin.
    pub(crate) fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to worker stdin");
        stdin.flush().expect("flush worker stdin");
    }

    /// The next line starting with `prefix` (other lines are kept in `seen`). Panics on an `ERROR` line, on
    /// end of output, or after `timeout`.
    pub(crate) fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    assert!(
                        !line.starts_with("ERROR"),
                        "worker {}: {line}\nits output:\n{}",
                        self.name,
                        self.seen.join("\n")
                    );
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "worker {}: no {prefix:?} line within {timeout:?}; output so far:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "worker {}: output ended before a {prefix:?} line ({:?}); output:\n{}",
                    self.name,
                    self.child.try_wait(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit successfully.
    pub(crate) fn wait_success(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(
                    status.success(),
                    "worker {} exited with {status}; output:\n{}",
                    self.name,
                    self.seen.join("\n")
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "worker {} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `KEY=VALUE` fields of a report line (after its verb).
pub(crate) fn fields(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|f| f.split_once('='))
        .collect()
}

/// A field parsed as `T`, panicking with the line if absent or malformed.
pub(crate) fn field<T: std::str::FromStr>(line: &str, name: &str) -> T {
    fields(line)
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no parsable field {name:?} in {line:?}"))
}
