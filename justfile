# Recipes mirror .ci/run step by step.

default: ci

# Everything CI runs, in the same order.
ci:
    .ci/run

fmt:
    cargo fmt --all -- --check

lint:
    cargo clippy --workspace --all-targets --all-features -- -D warnings

# The README's test command.
test:
    cargo test --all-features

# The tests as CI runs them: the same binaries, the slow live ones side by side (scripts/run-tests.py), and
# beside them once built the checks that need no server (docs, deps, rust-version, features, package).
test-parallel:
    python3 scripts/run-tests.py --alongside "bash scripts/ci-checks.sh" --all-features

# CI's checks that need no server, alone (scripts/ci-checks.sh; CI runs them beside the tests).
checks:
    bash scripts/ci-checks.sh

# The fast tier: the simulation (in-memory nodes, injected faults, virtual time; no servers), seconds.
sim:
    cargo test -p redlease --all-features --test sim

# The Valkey 8.1 and 9.1 binaries the live matrix also runs on, into .cache/valkey (as .ci/run does).
valkey:
    bash scripts/fetch-valkey.sh

# Live tests require redis-server and the Valkey binaries; this fails instead of skipping when one is missing.
test-live: valkey
    REDLEASE_REQUIRE_REDIS=1 cargo test --all-features

# The soak as CI runs it: 60 s per setup (the default run soaks a few seconds).
soak secs="60": valkey
    REDLEASE_REQUIRE_REDIS=1 REDLEASE_SOAK_SECS={{secs}} cargo test -p redlease-chaos --test soak

docs:
    RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --all-features

# The core must not depend on a Redis client or an async runtime.
deps:
    ! cargo tree -p redlease -e normal --prefix none | grep -E '^(tokio|redis|fred|async-std|smol) '

# Every crate's rust-version must be at least what its locked dependencies declare.
rust-version:
    python3 scripts/check-rust-version.py

# Publish dry-run of the three published crates (each tarball is built once), as CI does.
package:
    rm -rf target/package-check "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/redlease-*   # see scripts/ci-checks.sh
    CARGO_TARGET_DIR=target/package-check cargo publish --dry-run -p redlease -p redlease-testkit -p redlease-adapters

# ...and the three crates' tests from their tarballs alone (CI runs the first two; the adapters' builds both
# clients again, a few minutes).
package-test: package
    CARGO_TARGET_DIR=target/package-check bash scripts/test-tarballs.sh redlease redlease-testkit redlease-adapters

demo:
    cargo run -p redlease-demo

# Benchmarks against the raw Redis floor and peer crates (needs redis-server); writes target/bench/full.json.
bench:
    cargo run -p redlease-bench --release -- --out target/bench/full.json

# The short benchmark run (about three minutes, S6L's 100,000 leases included); writes target/bench/quick.json.
bench-quick:
    cargo run -p redlease-bench --release -- --quick --out target/bench/quick.json

# Valkey 9.1 native commands against scripts (S1, S3, S6 and the server's time per operation); writes
# target/bench/valkey.json.
bench-valkey: valkey
    cargo run -p redlease-bench --release -- --quick --only S1,S3,S6 --valkey --out target/bench/valkey.json

# Mutation testing of core's machines, driver and lease code (not in CI: tens of minutes). Needs
# `cargo install cargo-mutants`. First against core's unit tests (the machines' table tests, seconds per
# mutant), then the mutants they missed against the simulation too (`--iterate` retries only those).
mutants:
    cargo mutants -p redlease --all-features -j 1 -f 'core/src/machine/*.rs' -f 'core/src/driver/*.rs' -f core/src/lease.rs -f core/src/batch_queue.rs --cargo-test-arg=--lib -o target/mutants
    cargo mutants -p redlease --all-features -j 1 -f 'core/src/machine/*.rs' -f 'core/src/driver/*.rs' -f core/src/lease.rs -f core/src/batch_queue.rs --iterate --cargo-test-arg=--lib --cargo-test-arg=--test=sim -o target/mutants

# One eighth of the driver, lease and renewer-queue mutants against the unit tests and the simulation
# (`just mutants-shard 3`), the hostile simulations at a fifth of their seeds: about 45 minutes each on an
# idle 2-core machine, each shard the same slice of the list while those files do not change. MUTANTS.md
# records each shard's outcome and every survivor with why.
mutants-shard k:
    REDLEASE_SIM_SEEDS=200 REDLEASE_SEMAPHORE_SEEDS=200 REDLEASE_FAIR_SEEDS=200 REDLEASE_RW_SEEDS=200 REDLEASE_MULTI_SEEDS=200 REDLEASE_HANDOFF_SEEDS=100 nice -n 19 cargo mutants -p redlease --all-features -j 2 -f 'core/src/driver/*.rs' -f core/src/lease.rs -f core/src/batch_queue.rs --shard {{k}}/8 --timeout 60 --cargo-test-arg=--lib --cargo-test-arg=--test=sim -o target/mutants-{{k}}
