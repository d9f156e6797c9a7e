#!/usr/bin/env python3
"""Checks that every workspace member's `rust-version` is at least the `rust-version` that each of its
locked normal and build dependencies declares (all features on), so that the MSRV a crate states is true.

Reads the declared versions from `cargo metadata` and each member's dependency closure from `cargo tree`
(which resolves features for that member alone). Exits 1 with a table of the offenders.
"""

import json
import subprocess
import sys


def version_key(v):
    parts = [int(part) for part in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    declared = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}
    members = [p for p in meta["packages"] if p["id"] in meta["workspace_members"]]
    failures = []
    for member in sorted(members, key=lambda p: p["name"]):
        name, own = member["name"], member.get("rust_version")
        tree = subprocess.run(
            ["cargo", "tree", "--locked", "-p", name, "-e", "normal,build", "--all-features",
             "--prefix", "none", "-f", "{p}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        needed, by = None, None
        for line in tree.splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("v"):
                continue
            dep, version = parts[0], parts[1][1:]
            if dep == name:
                continue
            rv = declared.get((dep, version))
            if rv and (needed is None or version_key(rv) > version_key(needed)):
                needed, by = rv, f"{dep} {version}"
        if own is None:
            failures.append(f"{name}: declares no rust-version (its dependencies need {needed}, {by})")
        elif needed and version_key(own) < version_key(needed):
            failures.append(f"{name}: rust-version {own}, but {by} declares {needed}")
        print(f"{name:24} rust-version {own or '-':6} dependencies need {needed or '-':6} ({by or 'none'})")
    if failures:
        print("\nrust-version too low:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
