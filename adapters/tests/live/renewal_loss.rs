//! Definitive loss during auto-renewal: the key is deleted (`DEL`) or overwritten by a foreign `SET` while a
//! lease renews in the background. The next renewal reports the loss at once (`NotHeld`, long before the
//! validity deadline), the signal stays fired, and nothing is re-created, overwritten or renewed afterwards.

use std::time::{Duration, Instant};

use redlease::{LeaseState, LockManager, LossReason};
use redlease_testkit::server::{RedisServer, RedisServers};

use crate::common::{self, ALL_BACKENDS, Backend, config, key, on_every_server};

const TTL: Duration = Duration::from_secs(2);
const INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy)]
enum Cause {
    Del,
    ForeignSet,
}

#[test]
fn a_del_or_foreign_set_during_auto_renewal_is_reported_lost_at_the_next_renewal_and_stays_lost() {
    on_every_server(
        "a_del_or_foreign_set_during_auto_renewal_is_reported_lost_at_the_next_renewal_and_stays_lost",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, ALL_BACKENDS.len());
            // The backends run at the same time, each on a server of its own (the traffic check counts per server).
            let [a, b, c, d] = ALL_BACKENDS;
            tokio::join!(
                loss_during_renewal(a, &servers[0]),
                loss_during_renewal(b, &servers[1]),
                loss_during_renewal(c, &servers[2]),
                loss_during_renewal(d, &servers[3]),
            );
        },
    );
}

/// Both causes, one after the other, for `backend` on `server`.
async fn loss_during_renewal(backend: Backend, server: &RedisServer) {
    for cause in [Cause::Del, Cause::ForeignSet] {
        let what = format!("{backend:?} {cause:?}");
        let node = common::node(backend, &server.url()).await;
        let cfg = config(TTL);
        let op = cfg.operation_timeout_for(TTL);
        let manager = LockManager::single(node, cfg)
            .unwrap()
            .with_spawner(|task| {
                tokio::spawn(task);
            });
        let k = key(&format!("loss-{cause:?}"), backend);
        let lease = manager
            .lock(&k)
            .auto_renew(INTERVAL)
            .try_acquire()
            .await
            .unwrap();
        // Renewal is running: one renewal has moved the deadline.
        let first = lease.valid_until();
        assert!(
            eventually(TTL, || lease.valid_until() != first).await,
            "{what}: no renewal within one TTL"
        );
        let deadline = lease.valid_until();

        let caused = Instant::now();
        match cause {
            Cause::Del => assert_eq!(server.cmd(&["DEL", &k]), "1"),
            Cause::ForeignSet => {
                server.cmd(&["SET", &k, "intruder", "PX", "10000"]);
            }
        }
        let reason = tokio::time::timeout(TTL, lease.lost())
            .await
            .unwrap_or_else(|_| panic!("{what}: no loss signalled within one TTL"));
        let lost_after = caused.elapsed();
        assert_eq!(reason, LossReason::NotHeld, "{what}");
        // At once: by the next renewal (one interval away), its round (one operation timeout), and a
        // wake-up of this task (one more operation timeout of room): long before the deadline.
        assert!(
            lost_after <= INTERVAL + 2 * op,
            "{what}: loss reported {lost_after:?} after the {cause:?}"
        );
        assert!(
            caused + lost_after < deadline,
            "{what}: reported at the deadline, not by the renewal"
        );

        // The signal stays fired, and no renewal is sent any more. (The give-up clean-up after the
        // failed renewal, a compare-and-delete of our token, is one round bounded by the operation
        // timeout: the count starts after it.)
        tokio::time::sleep(op).await;
        let calls = common::lock_calls(server);
        tokio::time::sleep(3 * INTERVAL).await;
        assert!(lease.lost().has_ended(), "{what}");
        assert_eq!(
            tokio::time::timeout(op, lease.lost()).await,
            Ok(LossReason::NotHeld),
            "{what}: a second wait on the signal"
        );
        assert_eq!(
            lease.state(),
            LeaseState::Lost(LossReason::NotHeld),
            "{what}"
        );
        assert!(!lease.is_held(), "{what}");
        assert_eq!(
            common::lock_calls(server),
            calls,
            "{what}: renewal traffic after the loss"
        );
        match cause {
            Cause::Del => assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}: re-created"),
            Cause::ForeignSet => {
                assert_eq!(server.cmd(&["GET", &k]), "intruder", "{what}");
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                let floor = 10_000 - caused.elapsed().as_millis() as i64 - 1;
                assert!(
                    pttl >= floor && pttl <= 10_000,
                    "{what}: the intruder's TTL changed to {pttl}"
                );
            }
        }
        let err = lease.release().await.unwrap_err();
        assert!(err.is_lost(), "{what}: {err}");
        if let Cause::ForeignSet = cause {
            assert_eq!(server.cmd(&["GET", &k]), "intruder", "{what}: release");
            server.cmd(&["DEL", &k]);
        }
    }
}

/// Polls `check` every 5 ms for up to `within`.
async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
