#!/usr/bin/env bash
# CI's checks that need no server and no test binary: rustdoc, core's dependencies, rust-version, the
# adapters' features, packaging. `.ci/run` runs this beside the tests once they are built
# (`scripts/run-tests.py --alongside`): the tests mostly wait on servers and timers, and these fill the CPU
# they leave. Each check prints its name and time; the last lines sum them up. Runs alone too:
# `bash scripts/ci-checks.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

STEP_NAME=""
STEP_START=$SECONDS
CHECKS_START=$SECONDS
STEP_TIMES=()
end_step() {
    if [ -n "$STEP_NAME" ]; then
        local took=$((SECONDS - STEP_START))
        printf '<== %s: %d s\n' "$STEP_NAME" "$took"
        STEP_TIMES+=("$(printf '%5d s  %s' "$took" "$STEP_NAME")")
    fi
}
step() {
    end_step
    STEP_NAME="$*"
    STEP_START=$SECONDS
    printf '\n==> %s\n' "$*"
}
summary() {
    end_step
    STEP_NAME=""
    printf '\n==> check times\n'
    printf '%s\n' "${STEP_TIMES[@]}"
    printf '%5d s  in all\n' "$((SECONDS - CHECKS_START))"
}
trap summary EXIT

step "docs"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --all-features

step "core dependencies"
if cargo tree -p redlease -e normal --prefix none | grep -E '^(tokio|redis|fred|async-std|smol) '; then
    echo "redlease (core) must not depend on a Redis client or an async runtime" >&2
    exit 1
fi

step "rust-version of every crate at least its locked dependencies' (scripts/check-rust-version.py)"
python3 scripts/check-rust-version.py

step "adapters: runtime features select redis-rs's runtime support, redis-cluster / redis-sentinel its optional parts"
# smol alone must not pull in redis-rs's tokio support (redis-rs on smol panicked when it did), tokio alone
# not its smol support.
features_of_redis() {
    cargo tree -p redlease-adapters -e features -i redis --prefix none --no-default-features --features "$1" \
        | grep -oE '^redis feature "[a-z-]+"' | sort -u
}
features_of_redis redis,smol | grep -q '"smol-comp"' \
    && ! features_of_redis redis,smol | grep -q '"tokio-comp"' \
    && features_of_redis redis,tokio | grep -q '"tokio-comp"' \
    && ! features_of_redis redis,tokio | grep -q '"smol-comp"' \
    || { echo "redlease-adapters' runtime features no longer select redis-rs's runtime support" >&2; exit 1; }
# redis-rs's cluster and Sentinel support come only with `redis-cluster` / `redis-sentinel`.
! features_of_redis redis,tokio | grep -qE '"(cluster-async|sentinel)"' \
    && features_of_redis redis-cluster,tokio | grep -q '"cluster-async"' \
    && features_of_redis redis-sentinel,smol | grep -q '"sentinel"' \
    || { echo "redis-rs's cluster or Sentinel support no longer follows redis-cluster / redis-sentinel" >&2; exit 1; }
# `redis` without a runtime feature is a compile error that names the fix.
if out=$(cargo check -q -p redlease-adapters --no-default-features --features redis 2>&1); then
    echo "redlease-adapters with only the redis feature compiled; it must ask for a runtime feature" >&2
    exit 1
fi
grep -q 'add `tokio` or `smol` to the features' <<<"$out" \
    || { echo "unexpected error for the redis feature without a runtime:" >&2; echo "$out" >&2; exit 1; }

step "observability features add nothing to core when off"
if cargo tree -p redlease -e normal --prefix none | grep -E '^(tracing|tracing-core|metrics) '; then
    echo "redlease (core) must not depend on tracing or metrics without its features" >&2
    exit 1
fi
# ...and the check above would see them when on.
cargo tree -p redlease -e normal --prefix none --features tracing,metrics | grep -qE '^tracing ' \
    && cargo tree -p redlease -e normal --prefix none --features tracing,metrics | grep -qE '^metrics ' \
    || { echo "the tracing/metrics features no longer pull in tracing/metrics" >&2; exit 1; }

step "publish --dry-run of the published crates, in dependency order (each tarball builds alone)"
# Not `--workspace`: that packages and builds the unpublished members too (bench with its peer crates:
# about 5 minutes here). These three take about a minute; cargo orders them (redlease, then the testkit,
# then the adapters) and verifies each against the others' tarballs through a local registry.
# cargo takes registry crates to be immutable by name and version: an extraction in
# $CARGO_HOME/registry/src/-<hash>/ and a build of an earlier run's redlease 0.1.0 are reused however the
# sources changed since (the testkit was then checked against a stale core). So: a target directory of its
# own, emptied first, and no earlier extraction of ours (only local registries' directories there start
# with "-"). core/tests/ is left out of its tarball on purpose (cargo warns "ignoring test …"): those tests
# run on the testkit, which the published core cannot dev-depend on.
rm -rf target/package-check "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/redlease-*
CARGO_TARGET_DIR=target/package-check cargo publish --dry-run -p redlease -p redlease-testkit -p redlease-adapters
