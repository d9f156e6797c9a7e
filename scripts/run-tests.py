#!/usr/bin/env python3
"""Runs what `cargo test <args>` runs, with the slow live binaries side by side instead of one after another.

    python3 scripts/run-tests.py --all-features

`cargo test` runs its test binaries one at a time. Here every binary that `cargo test <args>` builds is run
(the same executables, with the environment cargo gives them), but in three lanes side by side: the slow
binaries that start servers of their own on free ports and share nothing fill two (SLOW_LANES), the rest run
one after another in the third, followed there by the doctests (`cargo test <args> --doc`).
Each binary's output is kept and printed whole when it fails; every binary's time is printed as it ends.
Exit status 1 if any binary or the doctests failed.

CI (`.ci/run`) uses this; `cargo test --all-features`, the README's test command, runs the same tests in one
process tree (about twice as long).
"""

import json
import os
import subprocess
import sys
import threading
import time

# The slow binaries, each a minute or more, that start servers of their own: `live` runs in a lane of its own,
# `faults` then `soak` in a second; everything else runs in a third, in cargo's order. (A lane each for the
# three made four processes of timing-sensitive tests on two cores; their timeouts then failed under load.)
SLOW_LANES = [
    [("redlease-adapters", "live")],
    [("redlease-adapters", "faults"), ("redlease-chaos", "soak")],
]
SLOW = {pair for lane in SLOW_LANES for pair in lane}

LOG_DIR = os.path.join("target", "run-tests")


def build(args):
    """`cargo test <args> --no-run`; returns the test executables, in cargo's order."""
    cmd = ["cargo", "test", *args, "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    binaries = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = msg["package_id"]
        # package_id: "path+file:///…/core#redlease@0.1.0" (or "…#0.1.0" when the name is the directory's).
        manifest = msg["manifest_path"]
        name = package.split("#")[-1].split("@")[0]
        if name[:1].isdigit():
            name = os.path.basename(os.path.dirname(manifest))
        binaries.append(
            {
                "package": name,
                "target": target["name"],
                "kind": target["kind"][0],
                "exe": msg["executable"],
                "dir": os.path.dirname(manifest),
            }
        )
    return binaries


def label(b):
    kind = "lib" if b["kind"] in ("lib", "rlib", "proc-macro") else b["kind"]
    return f'{b["package"]} {kind} {b["target"]}' if kind != "test" else f'{b["package"]} --test {b["target"]}'


print_lock = threading.Lock()
failures = []


def report(name, ok, seconds, log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    summary = [l for l in text.splitlines() if l.startswith("test result:")]
    with print_lock:
        status = "ok  " if ok else "FAIL"
        print(f"{status} {seconds:6.1f} s  {name}  {summary[-1] if summary else ''}", flush=True)
        if not ok:
            failures.append(name)
            print(f"----- output of {name} -----\n{text}----- end of {name} -----", flush=True)


def run_binary(b, extra):
    env = dict(os.environ)
    env["CARGO_MANIFEST_DIR"] = b["dir"]
    env["CARGO_PKG_NAME"] = b["package"]
    name = label(b)
    log_path = os.path.join(LOG_DIR, name.replace(" ", "_").replace("/", "_") + ".log")
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call([b["exe"], *extra], cwd=b["dir"], env=env, stdout=log, stderr=subprocess.STDOUT)
    report(name, code == 0, time.monotonic() - start, log_path)


def run_doctests(args):
    log_path = os.path.join(LOG_DIR, "doctests.log")
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(["cargo", "test", *args, "--doc"], stdout=log, stderr=subprocess.STDOUT)
    report("doctests", code == 0, time.monotonic() - start, log_path)


def main():
    args = sys.argv[1:]
    binaries = build(args)
    os.makedirs(LOG_DIR, exist_ok=True)
    slow = [b for b in binaries if (b["package"], b["target"]) in SLOW and b["kind"] == "test"]
    rest = [b for b in binaries if b not in slow]
    missing = SLOW - {(b["package"], b["target"]) for b in slow}
    if missing:
        print(f"run-tests.py: SLOW names binaries cargo did not build: {sorted(missing)}", file=sys.stderr)
        sys.exit(1)

    def rest_lane():
        for b in rest:
            run_binary(b, [])
        run_doctests(args)

    def slow_lane(pairs):
        for pair in pairs:
            for b in slow:
                if (b["package"], b["target"]) == pair:
                    run_binary(b, [])

    start = time.monotonic()
    lanes = [threading.Thread(target=slow_lane, args=(pairs,)) for pairs in SLOW_LANES]
    lanes.append(threading.Thread(target=rest_lane))
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    print(f"{len(binaries)} test binaries and the doctests in {time.monotonic() - start:.1f} s", flush=True)
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
