#!/usr/bin/env python3
"""Runs what `cargo test <args>` runs, with the slow live binaries side by side instead of one after another.

    python3 scripts/run-tests.py --all-features

`cargo test` runs its test binaries one at a time. Here every binary that `cargo test <args>` builds is run
(the same executables, with the environment cargo gives them), in three lanes side by side: `live` starts
one, `faults` then `soak` a second (SLOW_LANES: the slow binaries that start servers of their own on free
ports and share nothing), and every other binary and the doctests (`cargo test <args> --doc`) wait in one
queue that the third lane starts on and the others join when their slow binaries are done, so that the lanes
end close together. At most three test processes run at once.

Most of the tests wait more than they compute (`live` took about 70 s of CPU in 370 s; all the binaries
together about 180 s of CPU): SETTINGS can give a binary more tests at a time (`--test-threads`) and more
servers' bodies at once (`REDLEASE_MATRIX_PARALLEL`); see there for `live`'s. Each binary's time
and CPU time (its own and its servers') is printed as it ends, its output kept and printed whole when it
fails. Exit status 1 if any binary or the doctests failed.

CI (`.ci/run`) uses this; `cargo test --all-features`, the README's test command, runs the same tests one
binary after another with libtest's and the testkit's defaults (several times as long).
"""

import json
import os
import subprocess
import sys
import threading
import time

# The slow binaries, each a minute or more, that start servers of their own: `live` in a lane of its own,
# `faults` then `soak` in a second; everything else in a third, from a queue the lanes share once their own
# binaries end (so at most three test processes run at once). (A lane each for the three made four
# processes of timing-sensitive tests on two cores; their timeouts then failed under load.)
SLOW_LANES = [
    [("redlease-adapters", "live")],
    [("redlease-adapters", "faults"), ("redlease-chaos", "soak")],
]
SLOW = {pair for lane in SLOW_LANES for pair in lane}

# Arguments and environment for binaries that are mostly waiting. `live` spends most of its time waiting
# (about 75 s of CPU in 400 s at libtest's defaults): four tests and eight servers' bodies at once
# (`--test-threads=4`, `REDLEASE_MATRIX_PARALLEL=8`) take it to about three minutes. (Six and twelve took it
# to two and a half while it had fewer tests; with the Lua-less permit and multi-key tests of December 2026
# beside the checks lane, Valkey 9.1 without Lua — whose transactions pass a node's gate one at a time —
# timed out in one CI-like run of three.) `RUST_TEST_THREADS` or `REDLEASE_MATRIX_PARALLEL` in the environment overrides these
# (`RUST_TEST_THREADS=2 REDLEASE_MATRIX_PARALLEL=4` gives libtest's and the testkit's defaults again).
SETTINGS = {
    ("redlease-adapters", "live"): (["--test-threads=4"], {"REDLEASE_MATRIX_PARALLEL": "8"}),
}

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


def run_measured(cmd, log, **kwargs):
    """Runs `cmd` with its output to `log`; returns its exit code and the CPU seconds (user + system) of it
    and of the processes it waited for (the servers a test binary started and stopped)."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def report(name, ok, seconds, cpu, log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    summary = [l for l in text.splitlines() if l.startswith("test result:")]
    with print_lock:
        status = "ok  " if ok else "FAIL"
        print(
            f"{status} {seconds:6.1f} s (CPU {cpu:5.1f} s)  {name}  {summary[-1] if summary else ''}", flush=True
        )
        if not ok:
            failures.append(name)
            print(f"----- output of {name} -----\n{text}----- end of {name} -----", flush=True)


def run_binary(b):
    extra, settings = SETTINGS.get((b["package"], b["target"]), ([], {}))
    env = dict(os.environ)
    # What the caller set wins: `RUST_TEST_THREADS=2 REDLEASE_MATRIX_PARALLEL=4` gives every binary libtest's
    # and the testkit's defaults again.
    if "RUST_TEST_THREADS" in env:
        extra = [a for a in extra if not a.startswith("--test-threads")]
    for name, value in settings.items():
        env.setdefault(name, value)
    env["CARGO_MANIFEST_DIR"] = b["dir"]
    env["CARGO_PKG_NAME"] = b["package"]
    name = label(b)
    log_path = os.path.join(LOG_DIR, name.replace(" ", "_").replace("/", "_") + ".log")
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        code, cpu = run_measured([b["exe"], *extra], log, cwd=b["dir"], env=env)
    report(name, code == 0, time.monotonic() - start, cpu, log_path)


def run_doctests(args):
    log_path = os.path.join(LOG_DIR, "doctests.log")
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        code, cpu = run_measured(["cargo", "test", *args, "--doc"], log)
    report("doctests", code == 0, time.monotonic() - start, cpu, log_path)


def run_alongside(commands):
    """The `--alongside` commands, one after another, each reported like a test binary; their output (short:
    the checks print a line and a time each) is printed whole."""
    for i, command in enumerate(commands):
        log_path = os.path.join(LOG_DIR, f"alongside-{i}.log")
        start = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as log:
            code, cpu = run_measured(["bash", "-c", command], log)
        report(command, code == 0, time.monotonic() - start, cpu, log_path)
        if code == 0:
            with open(log_path, encoding="utf-8", errors="replace") as f, print_lock:
                print(f"----- output of {command} -----\n{f.read()}----- end of {command} -----", flush=True)


def main():
    args = sys.argv[1:]
    # `--alongside CMD` (repeatable): a shell command run in a lane of its own once the tests are built,
    # beside them (CI's checks that need no server: docs, dependency checks, packaging). Not passed to cargo.
    alongside = []
    while "--alongside" in args:
        i = args.index("--alongside")
        if i + 1 >= len(args):
            print("run-tests.py: --alongside needs a command", file=sys.stderr)
            sys.exit(2)
        alongside.append(args[i + 1])
        del args[i : i + 2]
    binaries = build(args)
    os.makedirs(LOG_DIR, exist_ok=True)
    slow = [b for b in binaries if (b["package"], b["target"]) in SLOW and b["kind"] == "test"]
    rest = [b for b in binaries if b not in slow]
    missing = SLOW - {(b["package"], b["target"]) for b in slow}
    if missing:
        print(f"run-tests.py: SLOW names binaries cargo did not build: {sorted(missing)}", file=sys.stderr)
        sys.exit(1)

    # The queue the lanes share: the doctests first (about 20 s, among the longest of the rest, and the longest
    # had best start early for the lanes to end together), then the other binaries in cargo's order.
    queue = [None, *rest]
    queue_lock = threading.Lock()

    def take_from_queue():
        while True:
            with queue_lock:
                if not queue:
                    return
                b = queue.pop(0)
            if b is None:
                run_doctests(args)
            else:
                run_binary(b)

    def slow_lane(pairs):
        for pair in pairs:
            for b in slow:
                if (b["package"], b["target"]) == pair:
                    run_binary(b)
        take_from_queue()

    start = time.monotonic()
    lanes = [threading.Thread(target=slow_lane, args=(pairs,)) for pairs in SLOW_LANES]
    lanes.append(threading.Thread(target=take_from_queue))
    if alongside:
        lanes.append(threading.Thread(target=run_alongside, args=(alongside,)))
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
