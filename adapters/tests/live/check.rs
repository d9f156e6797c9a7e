//! The start-up check (`LockManager::check`) through the one-line constructors of both clients, on every
//! server of the matrix: a wrong or missing password, a server that is down, a user without `EVAL`, and the
//! command paths each server gets. Nothing is written.

use std::time::Duration;

use redlease::{CheckReport, CommandPaths, Config, LockManager, Path, Readiness};
use redlease_adapters::SetupError;
use redlease_adapters::fred as fred_adapter;
use redlease_adapters::redis as redis_adapter;
use redlease_testkit::server::{Flavor, RedisServer, free_port};

use crate::common::on_every_server;
use crate::permissions::acl_user;

const PASSWORD: &str = "check-pw-4711";
const KEY: &str = "check:{nightly}:lock";

/// The paths a user who may run everything gets on each server.
fn full_paths(flavor: Flavor) -> CommandPaths {
    let native = CommandPaths::scripts().with_acquire(Path::Native);
    match flavor {
        // Where scripts run, the extension is the script (an extension never shortens a key; `SET … IFEQ
        // … PX` could).
        Flavor::Redis | Flavor::Valkey81 => native,
        Flavor::Valkey91 => native.with_release(Path::Native),
        Flavor::Valkey91NoLua => native
            .with_extend(Path::Native)
            .with_release(Path::Native)
            .with_retry_and_fence(Path::Native),
        other => panic!("no expectation for {other}"),
    }
}

/// Both clients' one-line single-server managers for `url`.
fn singles(url: &str) -> [(&'static str, Result<LockManager, SetupError>); 2] {
    let config = Config::default().with_expiry(Duration::from_secs(10));
    [
        ("redis-rs", redis_adapter::single(url, config.clone())),
        ("fred", fred_adapter::single(url, config)),
    ]
}

async fn check(client: &str, manager: Result<LockManager, SetupError>) -> CheckReport {
    let manager = manager.unwrap_or_else(|e| panic!("{client}: {e}"));
    manager.check(KEY).await.unwrap()
}

#[test]
fn the_start_up_check_reports_login_permissions_reachability_and_paths_on_every_server() {
    on_every_server(
        "the_start_up_check_reports_login_permissions_reachability_and_paths_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &["--requirepass", PASSWORD]);
            let port = server.port();
            let good = format!("redis://:{PASSWORD}@127.0.0.1:{port}/0");
            for (client, manager) in singles(&good) {
                let report = check(client, manager).await;
                let r = &report.nodes[0].readiness;
                assert_eq!(r.paths(), Some(full_paths(flavor)), "{client}: {report}");
                assert_eq!(
                    (r.reachable(), r.authenticated(), r.permitted()),
                    (Some(true), Some(true), Some(true)),
                    "{client}"
                );
                assert!(report.all_ready() && report.quorum_ready(), "{client}");
            }

            // A wrong password, and none: the login is refused, the server was reached.
            for url in [
                format!("redis://:wrong-pw@127.0.0.1:{port}/0"),
                format!("redis://127.0.0.1:{port}/0"),
            ] {
                for (client, manager) in singles(&url) {
                    let report = check(client, manager).await;
                    let r = &report.nodes[0].readiness;
                    assert!(
                        matches!(r, Readiness::LoginRefused(_)),
                        "{client} {url}: {r}"
                    );
                    assert_eq!(
                        (r.reachable(), r.authenticated()),
                        (Some(true), Some(false)),
                        "{client}"
                    );
                    assert!(!report.quorum_ready(), "{client}");
                    assert!(!report.to_string().contains(PASSWORD), "{report}");
                }
            }

            // A user without EVAL: held natively where the server offers every native command, refused
            // (naming EVAL) where it does not.
            let url = acl_user(&server, "nocheckscripts", &["+@all", "-@scripting"]);
            for (client, manager) in singles(&url) {
                let report = check(client, manager).await;
                let r = &report.nodes[0].readiness;
                match flavor {
                    Flavor::Valkey91 | Flavor::Valkey91NoLua => {
                        assert_eq!(
                            r.paths(),
                            Some(full_paths(Flavor::Valkey91NoLua)),
                            "{client}"
                        )
                    }
                    _ => {
                        assert!(matches!(r, Readiness::NotPermitted(_)), "{client}: {r}");
                        assert_eq!(
                            (r.reachable(), r.authenticated(), r.permitted()),
                            (Some(true), Some(true), Some(false)),
                            "{client}"
                        );
                        assert!(r.to_string().contains("EVAL"), "{client}: {r}");
                    }
                }
            }

            // A Redlock of this server and two ports nobody listens on: both down, no quorum.
            let urls = [
                good.clone(),
                format!("redis://127.0.0.1:{}/0", free_port()),
                format!("redis://127.0.0.1:{}/0", free_port()),
            ];
            let config = Config::default().with_expiry(Duration::from_secs(10));
            for (client, manager) in [
                ("redis-rs", redis_adapter::redlock(&urls, config.clone())),
                ("fred", fred_adapter::redlock(&urls, config.clone())),
            ] {
                let report = check(client, manager).await;
                assert!(report.nodes[0].readiness.is_ready(), "{client}: {report}");
                for down in &report.nodes[1..] {
                    assert!(
                        matches!(down.readiness, Readiness::Unreachable(_)),
                        "{client}: {report}"
                    );
                    assert_eq!(down.readiness.reachable(), Some(false));
                }
                assert_eq!(report.failed().count(), 2, "{client}");
                assert!(!report.quorum_ready(), "{client}");
            }
            // Nothing was written.
            assert_eq!(server.cmd(&["DBSIZE"]), "0");
        },
    );
}
