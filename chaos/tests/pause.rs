//! Holder pause: the process holding a fenced lease is stopped (`SIGSTOP`) for longer than its TTL. Another
//! process acquires with a larger fencing token and writes to a fenced store. When the first process is
//! continued (`SIGCONT`), its loss signal has fired, and the fenced store rejects the write it makes late with
//! its old token.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use redlease_testkit::server::{Flavor, RedisServer, on_each_flavor};
use support::{Worker, field};

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

const TTL_MS: u64 = 1000;

#[test]
fn a_holder_paused_past_its_ttl_sees_its_loss_signal_and_its_late_write_is_fenced_off() {
    let test = "a_holder_paused_past_its_ttl_sees_its_loss_signal_and_its_late_write_is_fenced_off";
    // The fenced store is a Lua script: every server with Lua.
    let with_lua = [Flavor::Redis, Flavor::Valkey81, Flavor::Valkey91];
    on_each_flavor(test, &with_lua, |flavor| {
        let server = RedisServer::start_flavor(flavor, &[]);
        let url = server.url();
        let ttl = TTL_MS.to_string();
        let args = |role: &'static str| {
            vec![
                "--role".to_owned(),
                role.to_owned(),
                "--mode".into(),
                "single".into(),
                "--nodes".into(),
                url.clone(),
                "--ttl-ms".into(),
                ttl.clone(),
                "--key".into(),
                "pause:{r}:lock".into(),
                "--fence-key".into(),
                "pause:{r}:fence".into(),
                "--store".into(),
                "pause:store".into(),
            ]
        };
        let (a_args, b_args) = (args("pause-holder"), args("fenced-writer"));

        let long = Duration::from_secs(30);
        let mut a = Worker::spawn("A", &refs(&a_args));
        a.expect("READY", long);
        a.send("go");
        let acquired = a.expect("ACQUIRED", long);
        let a_fence: u64 = field(&acquired, "fence");
        let first = a.expect("WRITE", long);
        assert!(
            field::<bool>(&first, "accepted"),
            "A's first write: {first}"
        );
        a.expect("PAUSE_ME", long);

        // While A runs, its background renewal keeps the lease: after twice the TTL the key still holds A's token.
        let token = server.cmd(&["GET", "pause:{r}:lock"]);
        assert!(!token.is_empty(), "A holds the lock key");
        std::thread::sleep(Duration::from_millis(2 * TTL_MS));
        assert_eq!(
            server.cmd(&["GET", "pause:{r}:lock"]),
            token,
            "A's renewal kept the lease alive while A was running"
        );

        // Stop A. B starts now and waits for the lock; it can only get it once A's key has expired.
        a.signal("STOP");
        let stopped = Instant::now();
        let mut b = Worker::spawn("B", &refs(&b_args));
        b.expect("READY", long);
        b.send("go");
        let b_acquired = b.expect("ACQUIRED", long);
        let b_fence: u64 = field(&b_acquired, "fence");
        assert!(
            b_fence > a_fence,
            "B's fencing token {b_fence} must exceed A's {a_fence}"
        );
        let b_write = b.expect("WRITE", long);
        assert!(field::<bool>(&b_write, "accepted"), "B's write: {b_write}");
        assert_eq!(field::<u64>(&b_write, "stored"), b_fence);
        b.expect("DONE", long);
        b.wait_success(long);

        // Keep A stopped for well over its TTL in total, then continue it.
        let min_stop = Duration::from_millis(2 * TTL_MS + 500);
        if let Some(rest) = min_stop.checked_sub(stopped.elapsed()) {
            std::thread::sleep(rest);
        }
        a.signal("CONT");
        let stop_lasted = stopped.elapsed();
        assert!(stop_lasted > Duration::from_millis(TTL_MS));
        // Give A's runtime a moment to run its timers, as any resumed process would, then let it go on.
        std::thread::sleep(Duration::from_millis(300));
        a.send("go");

        let signal = a.expect("SIGNAL", long);
        assert!(
            field::<bool>(&signal, "fired"),
            "A's loss signal had not fired {stop_lasted:?} after it was stopped: {signal}"
        );
        let reason: String = field(&signal, "reason");
        assert_ne!(reason, "released", "A never released: {signal}");
        let state = a.expect("STATE", long);
        assert!(
            !field::<bool>(&state, "held"),
            "A still thinks it holds: {state}"
        );
        let late = a.expect("LATE_WRITE", long);
        assert!(
            !field::<bool>(&late, "accepted"),
            "the fenced store accepted A's late write: {late}"
        );
        assert_eq!(field::<u64>(&late, "stored"), b_fence, "{late}");
        let release = a.expect("RELEASE", long);
        assert!(
            !field::<bool>(&release, "ok"),
            "A's release must report the loss: {release}"
        );
        a.wait_success(long);

        // The store holds B's write, untouched by A's late one.
        assert_eq!(
            server.cmd(&["HGET", "pause:store", "fence"]),
            b_fence.to_string()
        );
        assert_eq!(server.cmd(&["HGET", "pause:store", "value"]), "B");
        // A's late release did not delete anything of B's (B released its own lease already).
        assert_eq!(server.cmd(&["EXISTS", "pause:{r}:lock"]), "0");
        eprintln!("{test}: A stopped {stop_lasted:?}; fences A={a_fence} B={b_fence}; {signal}");
    });
}
