//! redis-rs on an executor other than tokio: smol. With both `tokio-comp` and `smol-comp` compiled in,
//! redis-rs uses smol when no tokio runtime is current, and redlease itself needs no runtime.

use std::time::Duration;

use redlease::{LockManager, SystemTimer};
use redlease_adapters::redis::{MultiplexedNode, redis};
use redlease_testkit::server::{RedisServer, on_each_flavor};

use crate::common::{EVERY_SERVER, config};

#[test]
fn redis_rs_node_works_on_smol_without_a_tokio_runtime() {
    let test = "redis_rs_node_works_on_smol_without_a_tokio_runtime";
    on_each_flavor(test, &EVERY_SERVER, |flavor| {
        let server = RedisServer::start_flavor(flavor, &[]);
        smol::block_on(async {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let client = redis::Client::open(server.url()).unwrap();
            let node = MultiplexedNode::connect(&client).await.unwrap();
            redlease_testkit::conformance::run(&node, &SystemTimer)
                .await
                .unwrap();
            let manager = LockManager::single(node, config(Duration::from_millis(300))).unwrap();
            let lease = manager
                .lock("smol:{x}:lock")
                .fenced("smol:{x}:fence")
                .renew_every(Duration::from_millis(60))
                .try_acquire()
                .await
                .unwrap();
            // Renewed across several TTLs while the work runs on smol's timer.
            lease
                .run(smol::Timer::after(Duration::from_millis(700)))
                .await
                .unwrap();
            assert_eq!(
                server.cmd(&["GET", "smol:{x}:lock"]),
                lease.token().as_str()
            );
            lease.release().await.unwrap();
            assert_eq!(server.cmd(&["EXISTS", "smol:{x}:lock"]), "0");
        });
    });
}
