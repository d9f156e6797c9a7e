//! The testkit's conformance suite against every single-server backend.

use redlease::SystemTimer;
use redlease_testkit::server::RedisServer;

use crate::common::{self, ALL_BACKENDS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_passes_the_conformance_suite() {
    let Some(server) = RedisServer::start_or_skip("every_backend_passes_the_conformance_suite")
    else {
        return;
    };
    for backend in ALL_BACKENDS {
        let node = common::node(backend, &server.url()).await;
        if let Err(failure) = redlease_testkit::conformance::run(&*node, &SystemTimer).await {
            panic!("{backend:?}: {failure}");
        }
    }
}
