#!/usr/bin/env bash
# Tests the published crates from their tarballs alone, as a user (or crater) would after `cargo package`:
# each extracted .crate is tested in a directory of its own, outside the workspace, with the other packaged
# crates of this workspace patched in for the registry (none is published yet). Takes the crates to test as
# arguments (default: redlease redlease-testkit); expects `cargo package`/`cargo publish --dry-run` to have
# written them under $CARGO_TARGET_DIR/package (default target/package-check).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target="${CARGO_TARGET_DIR:-$root/target/package-check}"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
# Outside the workspace (cargo would take the crates for unlisted members of it), removed afterwards; the
# build goes to $target/tarballs so that a second run is incremental.
work=$(mktemp -d "${TMPDIR:-/tmp}/redlease-tarballs.XXXXXX")
trap 'rm -rf "$work"' EXIT
for crate in redlease redlease-testkit redlease-adapters; do
    # `cargo package` leaves the .crate in package/, `cargo publish --dry-run` in package/tmp-crate/.
    file="$target/package/$crate-$version.crate"
    [ -f "$file" ] || file="$target/package/tmp-crate/$crate-$version.crate"
    tar -xzf "$file" -C "$work"
done
patch=(--config "patch.crates-io.redlease.path=\"$work/redlease-$version\""
       --config "patch.crates-io.redlease-testkit.path=\"$work/redlease-testkit-$version\"")
# Live tests may not find the workspace's Valkey binaries from there: they skip instead of failing.
unset REDLEASE_REQUIRE_REDIS
for crate in "${@:-redlease redlease-testkit}"; do
    for c in $crate; do
        printf '\n--> %s from its tarball\n' "$c"
        (cd "$work/$c-$version" && CARGO_TARGET_DIR="$target/tarballs" cargo test -q "${patch[@]}" --all-features)
    done
done
