//! The examples in `adapters/examples/`, run against temporary servers: their `run` functions are compiled
//! into this test from the example files themselves, and each checks its own claims (returning an error
//! otherwise); here the reported outcomes are checked once more. (Each example includes the shared
//! `examples/common` module, hence three copies of it here.)

use redlease_testkit::server::{RedisServer, RedisServers};

use crate::common::{WITH_LUA, on_every_server, on_servers};

#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/cron_singleton.rs"]
mod cron_singleton;
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/fenced_write.rs"]
mod fenced_write;
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/redlock_three.rs"]
mod redlock_three;

#[test]
fn example_cron_singleton_runs_each_tick_on_exactly_one_instance() {
    on_every_server(
        "example_cron_singleton_runs_each_tick_on_exactly_one_instance",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let outcomes = cron_singleton::run(&server.url()).await.unwrap();
            assert_eq!(outcomes.len(), 2);
            for o in &outcomes {
                assert_eq!(o.ran_on.len(), 1, "{o:?}");
                assert_eq!(o.skipped, 2, "{o:?}");
            }
            // Every lease was released; one "done" marker per tick.
            assert_eq!(server.cmd(&["EXISTS", "cron:{nightly-report}:lock"]), "0");
            assert_eq!(
                server
                    .cmd(&["KEYS", "cron:{nightly-report}:done:*"])
                    .lines()
                    .count(),
                2
            );
        },
    );
}

#[test]
fn example_fenced_write_rejects_the_stale_holders_late_write() {
    // The example's fenced resource is a Lua script: every server with Lua.
    on_servers(
        "example_fenced_write_rejects_the_stale_holders_late_write",
        &WITH_LUA,
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let outcome = fenced_write::run(&server.url()).await.unwrap();
            assert_eq!(
                outcome,
                fenced_write::FencedOutcome {
                    stale_fence: 1,
                    new_fence: 2,
                    stale_write_rejected: true,
                    stale_release_reported_lost: true,
                    final_value: "written by B".into(),
                }
            );
            assert_eq!(server.cmd(&["GET", "report:{42}:data-fence"]), "2");
        },
    );
}

#[test]
fn example_redlock_three_grants_on_a_majority_and_survives_one_killed_server() {
    on_every_server(
        "example_redlock_three_grants_on_a_majority_and_survives_one_killed_server",
        |flavor| async move {
            let mut servers = RedisServers::start_flavor(flavor, 3);
            let urls = servers.urls();
            let outcome = redlock_three::run(&urls, Some(&mut servers)).await.unwrap();
            assert!(outcome.held_on >= 2, "{outcome:?}");
            assert!(outcome.second_refused, "{outcome:?}");
            assert!(outcome.second_acquired_after_release, "{outcome:?}");
            assert_eq!(outcome.acquired_with_one_killed, Some(true), "{outcome:?}");
            for i in 1..3 {
                assert_eq!(
                    servers[i].cmd(&["EXISTS", "jobs:rebuild-search-index:lock"]),
                    "0"
                );
            }
        },
    );
}
