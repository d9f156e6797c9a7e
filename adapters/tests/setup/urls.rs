//! The constructors that take timeouts keep the endpoint (so Redlock still refuses one server twice) and
//! hand the timeouts to the client; the URL managers hold leases on real servers and refuse bad URLs before
//! connecting.

#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
mod with_a_client {
    use std::time::{Duration, Instant};

    use redlease::{Config, ConfigError, LockManager, RedisNode};
    use redlease_adapters::{SetupError, Timeouts};
    use redlease_testkit::server::{Flavor, RedisServer, RedisServers, on_each_flavor};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    fn config() -> Config {
        Config::default()
            .with_expiry(Duration::from_secs(2))
            .with_attempts(1)
    }

    /// [`config`] with rounds of 2 s (a 10 s expiry), for tests whose point is not latency: a hundred calls
    /// made at once on a loaded machine must not fail by timing out.
    fn patient() -> Config {
        config().with_expiry(Duration::from_secs(10))
    }

    /// Connections the server has accepted so far.
    fn connections(server: &RedisServer) -> u64 {
        let info = server.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received")
    }

    /// Pauses `server` for `pause` from a thread of its own, then resumes it.
    fn pause_for(server: &RedisServer, pause: Duration) -> std::thread::JoinHandle<()> {
        server.pause();
        let pid = server.pid().unwrap();
        std::thread::spawn(move || {
            std::thread::sleep(pause);
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        })
    }

    /// Holds a lease through `manager` and checks it on a majority of `servers` (a Redlock acquisition
    /// returns at its quorum; a straggler's `SET` may land later), then releases it.
    async fn hold(manager: &LockManager, servers: &[&RedisServer], key: &str) {
        let lease = manager.lock(key).try_acquire().await.unwrap();
        let holding = servers
            .iter()
            .filter(|s| s.cmd(&["GET", key]) == lease.token().as_str())
            .count();
        assert!(
            holding > servers.len() / 2,
            "{holding} of {}",
            servers.len()
        );
        assert!(lease.release().await.unwrap().deleted() > servers.len() / 2);
    }

    /// `n` acquisitions of one key made at once on a freshly built `manager` (nothing connected yet): every
    /// one but the winner reports contention, none fails because the connection was not up yet. One wins on a
    /// single server; on Redlock at most one (`n` calls at once may split the vote, so that none has a quorum:
    /// contention too).
    async fn first_use_at_once(manager: LockManager, key: &str, n: usize) {
        let redlock = manager.quorum() > 1;
        let manager = std::sync::Arc::new(manager);
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (manager, key) = (std::sync::Arc::clone(&manager), key.to_owned());
                tokio::spawn(async move { manager.lock(&key).try_acquire().await })
            })
            .collect();
        let mut won = Vec::new();
        let mut failed = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(lease) => won.push(lease),
                Err(redlease::Error::NotAcquired {
                    reason: redlease::NotAcquiredReason::Contended,
                    ..
                }) => {}
                Err(e) => failed.push(crate::chain(&e)),
            }
        }
        let mut kinds = failed.clone();
        kinds.sort();
        kinds.dedup();
        assert!(
            failed.is_empty(),
            "{} of {n} concurrent first acquisitions failed: {}",
            failed.len(),
            kinds.join("\n    ")
        );
        if redlock {
            assert!(won.len() <= 1, "{} of {n} won", won.len());
        } else {
            assert_eq!(won.len(), 1, "exactly one of {n} wins");
        }
        for lease in won {
            lease.release().await.unwrap();
        }
    }

    #[cfg(all(feature = "redis", feature = "tokio"))]
    mod redis_rs {
        use super::*;
        use redlease_adapters::redis::{self, LazyNode, ManagedNode, MultiplexedNode, redis as rs};

        #[test]
        fn the_timeout_constructors_keep_the_endpoint_so_redlock_refuses_one_server_twice() {
            on_each_flavor(
                "the_timeout_constructors_keep_the_endpoint_so_redlock_refuses_one_server_twice",
                &Flavor::ALL,
                |flavor| {
                    let servers = RedisServers::start_flavor(flavor, 2);
                    let t = Timeouts::new(Duration::from_millis(500), Duration::from_millis(500))
                        .unwrap();
                    let (a, b) = (servers.urls()[0].clone(), servers.urls()[1].clone());
                    let expected = a.clone();
                    rt().block_on(async move {
                        let ca = rs::Client::open(a.as_str()).unwrap();
                        let cb = rs::Client::open(b.as_str()).unwrap();
                        let multiplexed = MultiplexedNode::connect_with_timeouts(&ca, t)
                            .await
                            .unwrap();
                        let managed = ManagedNode::connect_with_timeouts(&ca, t).await.unwrap();
                        let lazy = LazyNode::with_timeouts(ca.clone(), t);
                        for endpoint in [
                            multiplexed.profile().endpoint,
                            managed.profile().endpoint,
                            lazy.profile().endpoint,
                        ] {
                            assert_eq!(endpoint.as_deref(), Some(expected.as_str()));
                        }
                        let other = MultiplexedNode::connect_with_timeouts(&cb, t)
                            .await
                            .unwrap();
                        let err = LockManager::redlock_dyn(
                            vec![
                                std::sync::Arc::new(multiplexed),
                                std::sync::Arc::new(other),
                                std::sync::Arc::new(lazy),
                            ],
                            config(),
                        )
                        .unwrap_err();
                        assert!(matches!(err, ConfigError::Topology(_)), "{err}");
                    });
                },
            );
        }

        #[test]
        fn the_response_timeout_given_is_the_clients_for_every_timeout_constructor() {
            on_each_flavor(
                "the_response_timeout_given_is_the_clients_for_every_timeout_constructor",
                &Flavor::ALL,
                |flavor| {
                    let server = RedisServer::start_flavor(flavor, &[]);
                    // redis-rs's default response timeout is 500 ms: a reply 1.5 s late succeeds only with ours (5 s).
                    let t = Timeouts::new(Duration::from_secs(1), Duration::from_secs(5)).unwrap();
                    let client = rs::Client::open(server.url()).unwrap();
                    rt().block_on(async {
                        let nodes: Vec<Box<dyn RedisNode>> = vec![
                            Box::new(
                                MultiplexedNode::connect_with_timeouts(&client, t)
                                    .await
                                    .unwrap(),
                            ),
                            Box::new(
                                ManagedNode::connect_with_timeouts(&client, t)
                                    .await
                                    .unwrap(),
                            ),
                            Box::new(LazyNode::with_timeouts(client.clone(), t)),
                        ];
                        for (i, node) in nodes.iter().enumerate() {
                            node.inspect("urls:{late}").await.unwrap(); // connected
                            let resume = pause_for(&server, Duration::from_millis(1_500));
                            let started = Instant::now();
                            let answer = node.inspect("urls:{late}").await;
                            resume.join().unwrap();
                            assert!(answer.is_ok(), "node {i}: {answer:?}");
                            assert!(
                                started.elapsed() >= Duration::from_millis(1_400),
                                "node {i}"
                            );
                        }
                    });
                },
            );
        }

        #[test]
        fn a_single_url_manager_holds_a_lease_on_a_real_server() {
            on_each_flavor(
                "a_single_url_manager_holds_a_lease_on_a_real_server",
                &Flavor::ALL,
                |flavor| {
                    let server = RedisServer::start_flavor(flavor, &[]);
                    let manager = redis::single(&server.url(), config()).unwrap();
                    rt().block_on(hold(&manager, &[&server], "urls:{single}"));
                },
            );
        }

        #[test]
        fn a_redlock_url_manager_holds_a_lease_on_three_servers() {
            on_each_flavor(
                "a_redlock_url_manager_holds_a_lease_on_three_servers",
                &Flavor::ALL,
                |flavor| {
                    let servers = RedisServers::start_flavor(flavor, 3);
                    let manager = redis::redlock(servers.urls(), config()).unwrap();
                    assert_eq!(manager.quorum(), 2);
                    let all: Vec<&RedisServer> = servers.iter().collect();
                    rt().block_on(hold(&manager, &all, "urls:{redlock}"));
                },
            );
        }

        #[test]
        fn url_managers_refuse_a_bad_url_before_connecting_by_index_without_credentials() {
            on_each_flavor(
                "url_managers_refuse_a_bad_url_before_connecting_by_index_without_credentials",
                &Flavor::ALL,
                |flavor| {
                    let server = RedisServer::start_flavor(flavor, &[]);
                    let before = connections(&server);
                    let good = server.url();
                    for bad in [
                        "redis://user:s3cret@127.0.0.1:notaport/0",
                        "http://user:s3cret@127.0.0.1/",
                    ] {
                        let err = redis::redlock([good.as_str(), bad, good.as_str()], config())
                            .unwrap_err();
                        assert!(matches!(err, SetupError::Url { index: 1, .. }), "{err:?}");
                        let text = format!("{err} {err:?}");
                        assert!(!text.contains("s3cret"), "{text}");
                        assert!(
                            err.to_string().starts_with("node 1: invalid Redis URL"),
                            "{err}"
                        );
                        assert!(matches!(
                            redis::single(bad, config()),
                            Err(SetupError::Url { index: 0, .. })
                        ));
                    }
                    // Nothing connected, neither for the good URLs before the bad one nor after.
                    assert_eq!(connections(&server), before + 1); // the INFO above is one
                },
            );
        }

        /// 100 acquisitions at once on freshly built one-line managers (single and Redlock): one wins, the
        /// rest meet contention.
        #[test]
        fn one_line_managers_take_concurrent_first_use() {
            on_each_flavor(
                "one_line_managers_take_concurrent_first_use (redis-rs)",
                &Flavor::ALL,
                |flavor| {
                    let servers = RedisServers::start_flavor(flavor, 3);
                    let single = redis::single(&servers.urls()[0], patient()).unwrap();
                    let redlock = redis::redlock(servers.urls(), patient()).unwrap();
                    rt().block_on(async {
                        first_use_at_once(single, "urls:{first-single}", 100).await;
                        first_use_at_once(redlock, "urls:{first-redlock}", 100).await;
                    });
                },
            );
        }

        #[test]
        fn url_managers_refuse_one_server_twice_and_an_even_count() {
            let url = "redis://127.0.0.1:7/0";
            let err = redis::redlock(
                [url, "redis://127.0.0.1:7", "redis://127.0.0.1:8"],
                config(),
            )
            .unwrap_err();
            assert!(
                matches!(err, SetupError::Config(ConfigError::Topology(_))),
                "{err}"
            );
            let err = redis::redlock([url, "redis://127.0.0.1:8"], config()).unwrap_err();
            assert!(
                matches!(err, SetupError::Config(ConfigError::Topology(_))),
                "{err}"
            );
            let err = redis::single(url, config().with_attempts(0)).unwrap_err();
            assert!(
                matches!(err, SetupError::Config(ConfigError::ZeroAttempts)),
                "{err}"
            );
        }
    }

    #[cfg(feature = "fred")]
    mod fred {
        use super::*;
        use redlease_adapters::fred::{self, ClientNode};

        #[test]
        fn from_url_keeps_the_endpoint_so_redlock_refuses_one_server_twice() {
            let t = Timeouts::new(Duration::from_millis(500), Duration::from_millis(500)).unwrap();
            let a = ClientNode::from_url("redis://127.0.0.1:7/0", t).unwrap();
            assert_eq!(
                a.profile().endpoint.as_deref(),
                Some("redis://127.0.0.1:7/0")
            );
            let b = ClientNode::from_url("redis://127.0.0.1:7", t).unwrap();
            let c = ClientNode::from_url("redis://127.0.0.1:8", t).unwrap();
            let err = LockManager::redlock([a, b, c], config()).unwrap_err();
            assert!(matches!(err, ConfigError::Topology(_)), "{err}");
        }

        #[test]
        fn the_response_timeout_given_to_from_url_is_the_nodes_command_timeout() {
            on_each_flavor(
                "the_response_timeout_given_to_from_url_is_the_nodes_command_timeout",
                &Flavor::ALL,
                |flavor| {
                    let server = RedisServer::start_flavor(flavor, &[]);
                    // fred has no command timeout by default: without ours the call would wait for the resume.
                    let t =
                        Timeouts::new(Duration::from_secs(1), Duration::from_millis(300)).unwrap();
                    let node = ClientNode::from_url(&server.url(), t).unwrap();
                    rt().block_on(async {
                        node.inspect("urls:{late}").await.unwrap(); // connected
                        let resume = pause_for(&server, Duration::from_secs(3));
                        let started = Instant::now();
                        let err = node.inspect("urls:{late}").await.unwrap_err();
                        let waited = started.elapsed();
                        resume.join().unwrap();
                        assert_eq!(err.kind(), redlease::NodeErrorKind::Timeout, "{err}");
                        assert!(err.is_ambiguous());
                        assert!(waited < Duration::from_millis(2_500), "{waited:?}");
                    });
                },
            );
        }

        #[test]
        fn a_single_url_manager_holds_a_lease_on_a_real_server() {
            on_each_flavor(
                "a_single_url_manager_holds_a_lease_on_a_real_server",
                &Flavor::ALL,
                |flavor| {
                    let server = RedisServer::start_flavor(flavor, &[]);
                    let manager = fred::single(&server.url(), config()).unwrap();
                    rt().block_on(hold(&manager, &[&server], "urls:{fred-single}"));
                },
            );
        }

        #[test]
        fn a_redlock_url_manager_holds_a_lease_on_three_servers() {
            on_each_flavor(
                "a_redlock_url_manager_holds_a_lease_on_three_servers",
                &Flavor::ALL,
                |flavor| {
                    let servers = RedisServers::start_flavor(flavor, 3);
                    let manager = fred::redlock(servers.urls(), config()).unwrap();
                    let all: Vec<&RedisServer> = servers.iter().collect();
                    rt().block_on(hold(&manager, &all, "urls:{fred-redlock}"));
                },
            );
        }

        /// 100 acquisitions at once on freshly built one-line managers (single and Redlock): one wins, the
        /// rest meet contention; none is refused because fred was still connecting.
        #[test]
        fn one_line_managers_take_concurrent_first_use() {
            on_each_flavor(
                "one_line_managers_take_concurrent_first_use (fred)",
                &Flavor::ALL,
                |flavor| {
                    let servers = RedisServers::start_flavor(flavor, 3);
                    let single = fred::single(&servers.urls()[0], patient()).unwrap();
                    let redlock = fred::redlock(servers.urls(), patient()).unwrap();
                    rt().block_on(async {
                        first_use_at_once(single, "urls:{first-single}", 100).await;
                        first_use_at_once(redlock, "urls:{first-redlock}", 100).await;
                    });
                },
            );
        }

        #[test]
        fn url_managers_refuse_a_bad_url_before_connecting_by_index_without_credentials() {
            for bad in [
                "redis://user:s3cret@127.0.0.1:notaport/0",
                "http://user:s3cret@127.0.0.1/",
            ] {
                let urls = ["redis://127.0.0.1:7", bad, "redis://127.0.0.1:8"];
                let err = fred::redlock(urls, config()).unwrap_err();
                assert!(matches!(err, SetupError::Url { index: 1, .. }), "{err:?}");
                let text = format!("{err} {err:?}");
                assert!(!text.contains("s3cret"), "{text}");
                assert!(matches!(
                    fred::single(bad, config()),
                    Err(SetupError::Url { index: 0, .. })
                ));
            }
        }
    }
}
