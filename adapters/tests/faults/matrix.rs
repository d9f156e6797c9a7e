//! Lost replies at any step, on every server of the matrix: a reply lost (and its connection closed) at a
//! random moment of a fenced acquisition, an extension or a release — on Valkey 9.1 without Lua the fenced
//! acquisition is three steps, so the loss lands between them too. The call is ambiguous (or succeeded
//! before the loss), the lock key never lacks a TTL, a retry of the same call through the same node (after
//! it reconnected) succeeds, fences strictly increase over every acquisition that returned one, and a
//! release leaves nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{NodeError, RedisNode, Token, Ttl};
use redlease_testkit::proxy::{FaultProxy, ProxyMode};
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, RECONNECTING, Rng};

const TRIALS_PER_BACKEND: u32 = 24;
const LATENCY: Duration = Duration::from_millis(2);

/// Retries `op` through the same node until its connection works again (the loss closed it).
async fn retried<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, NodeError>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what}: still failing: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Fenced,
    Extend,
    Release,
}

async fn lost_replies_on(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let seed = common::seed();
    println!("lost replies on {flavor}: seed {seed} (replay with REDLEASE_SEED={seed})");
    let mut rng = Rng::new(seed);
    // Far longer than a retry's deadline: a retry must recognise its lock, not outlive it.
    let ttl = Ttl::from_millis(30_000).unwrap();
    for backend in RECONNECTING {
        let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
        let node: Arc<dyn RedisNode> = common::node(backend, &format!("{}/0", proxy.url())).await;
        let k = format!("lost:{{{backend:?}}}:lock");
        let f = format!("lost:{{{backend:?}}}:fence");
        let mut last_fence = 0u64;
        let mut lost = 0;
        for trial in 0..TRIALS_PER_BACKEND {
            // The first three trials lose the first reply of each operation for certain (no delay).
            let pick = if trial < 3 {
                u64::from(trial)
            } else {
                rng.below(3)
            };
            let op = [Op::Fenced, Op::Extend, Op::Release][pick as usize];
            // Every chunk is held LATENCY each way, so a call of one to four round trips takes 2-8 LATENCY: the
            // loss, switched on at a random moment in that span, lands on a random step.
            // (A one-round-trip call is still waiting for its reply before 2 LATENCY: the loss hits it.)
            let span = match op {
                Op::Fenced => 7,
                _ => 2,
            };
            let delay = if trial < 3 {
                Duration::ZERO
            } else {
                Duration::from_micros(rng.below(span * LATENCY.as_micros() as u64 * 9 / 10))
            };
            let what = format!(
                "{flavor} {backend:?} seed={seed} trial {trial}: {op:?} lost after {delay:?}"
            );
            let token = Token::random().unwrap();
            if !matches!(op, Op::Fenced) {
                // A held lease to extend or release (taken without faults).
                let n = retried(&what, || node.acquire_fenced(&k, &f, &token, ttl)).await;
                let n = n.unwrap_or_else(|| panic!("{what}: free key contended"));
                assert!(n > last_fence, "{what}: fence {n} after {last_fence}");
                last_fence = n;
            }
            proxy.set_mode(ProxyMode::Latency(LATENCY));
            let call = {
                let (node, k, f, token) = (Arc::clone(&node), k.clone(), f.clone(), token.clone());
                tokio::spawn(async move {
                    match op {
                        Op::Fenced => node
                            .acquire_fenced(&k, &f, &token, ttl)
                            .await
                            .map(|n| n.map(|n| (n, true))),
                        Op::Extend => node
                            .extend(&k, &token, Ttl::from_millis(40_000).unwrap())
                            .await
                            .map(|b| Some((0, b))),
                        Op::Release => node.release(&k, &token).await.map(|b| Some((0, b))),
                    }
                })
            };
            tokio::time::sleep(delay).await;
            proxy.set_mode(ProxyMode::LoseNextReply);
            let result = tokio::time::timeout(Duration::from_secs(3), call)
                .await
                .unwrap_or_else(|_| panic!("{what}: no answer (re-sent after reconnecting?)"))
                .unwrap();
            proxy.set_mode(ProxyMode::Forward);
            lost += u32::from(result.is_err());
            match (op, result) {
                (Op::Fenced, Ok(Some((n, _)))) => {
                    assert!(n > last_fence, "{what}: fence {n} after {last_fence}");
                    last_fence = n;
                }
                (Op::Fenced, Ok(None)) => panic!("{what}: a free key was contended"),
                (Op::Fenced, Err(e)) => {
                    assert!(
                        e.is_ambiguous() || e.kind() == redlease::NodeErrorKind::Connection,
                        "{what}: {e}"
                    );
                    // The same acquisition retried (what the core does): ours, with a number above all before.
                    let n = retried(&what, || node.acquire_fenced(&k, &f, &token, ttl)).await;
                    let n =
                        n.unwrap_or_else(|| panic!("{what}: the retry did not recognise its lock"));
                    assert!(n > last_fence, "{what}: retry fence {n} after {last_fence}");
                    last_fence = n;
                }
                (Op::Extend, Ok(Some((_, extended)))) => assert!(extended, "{what}"),
                (Op::Extend, Err(_)) => {
                    assert!(
                        retried(&what, || node.extend(&k, &token, ttl)).await,
                        "{what}"
                    );
                }
                (Op::Release, Ok(Some((_, released)))) => assert!(released, "{what}"),
                (Op::Release, Err(_)) => {
                    retried(&what, || node.release(&k, &token)).await;
                }
                (_, Ok(None)) => unreachable!(),
            }
            if !matches!(op, Op::Release) {
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                assert!(pttl > 0, "{what}: the lock key has PTTL {pttl}");
                assert_eq!(server.cmd(&["GET", &k]), token.as_str(), "{what}");
                assert!(retried(&what, || node.release(&k, &token)).await, "{what}");
            }
            assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}: the lock remains");
            let counter: u64 = server.cmd(&["GET", &f]).parse().unwrap();
            assert!(
                counter >= last_fence,
                "{what}: counter {counter} below fence {last_fence}"
            );
        }
        eprintln!(
            "lost replies on {flavor} {backend:?}: {TRIALS_PER_BACKEND} trials, {lost} calls lost their reply, \
             last fence {last_fence}"
        );
        assert!(
            lost >= 3,
            "{flavor} {backend:?} seed={seed}: only {lost} replies were lost; the first three trials lose theirs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_at_any_step_on_redis_7_0() {
    lost_replies_on(Flavor::Redis, "lost_replies_at_any_step_on_redis_7_0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_at_any_step_on_valkey_8_1() {
    lost_replies_on(Flavor::Valkey81, "lost_replies_at_any_step_on_valkey_8_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_at_any_step_on_valkey_9_1() {
    lost_replies_on(Flavor::Valkey91, "lost_replies_at_any_step_on_valkey_9_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_at_any_step_on_valkey_9_1_without_lua() {
    lost_replies_on(
        Flavor::Valkey91NoLua,
        "lost_replies_at_any_step_on_valkey_9_1_without_lua",
    )
    .await;
}
