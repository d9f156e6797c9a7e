#!/usr/bin/env python3
"""BENCHMARKS.md's ratio tables from a full `redlease-bench` run's JSON.

    python3 scripts/bench-tables.py target/bench/full.json

Prints Markdown: the ratios against the floors (raw, raw-fred), against each peer, the S9 contention
table and the S10 cycle table. Each ratio is redlease's figure divided by the other's, from the JSON's
values; a missing figure prints as an empty cell or "–".
"""
import json
import sys

PEERS = ["rslock", "distributed-lock-redis", "async-redis-lock"]


def load(path):
    with open(path) as f:
        rows = json.load(f)
    return {(r["scenario"], r["impl"], r["nodes"]): r for r in rows}


def fmt(v, digits=1):
    if v is None:
        return ""
    if abs(v) >= 10_000:
        return f"{v:,.0f}".replace(",", " ")
    if abs(v) >= 1_000:
        return f"{v:,.0f}".replace(",", " ")
    return f"{v:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def r3(v):
    return "–" if v is None else f"{v:.3f}"


def main(path):
    rows = load(path)

    def get(scenario, imp, nodes, field):
        row = rows.get((scenario, imp, nodes))
        return None if row is None else row.get(field)

    floors = [
        ("S1 p50 (µs, lower is better)", "S1", 1, "p50_us"),
        ("S2 3-node p50", "S2", 3, "p50_us"),
        ("S2 5-node p50", "S2", 5, "p50_us"),
        ("S3 pairs/s (higher is better)", "S3", 1, "ops_per_s"),
        ("S3 client CPU µs per pair", "S3", 1, "cpu_us_per_op"),
        ("S3 allocations per pair", "S3", 1, "allocs_per_op"),
        ("S6 bytes per held lease, 10 000 leases", "S6", 1, "bytes_per_lease"),
        ("S6 client CPU per renewal", "S6", 1, "cpu_us_per_renewal"),
    ]
    print("| figure | raw | raw-fred | redlease/redis | ÷ raw | redlease/fred | ÷ raw | ÷ raw-fred |")
    print("|---|---|---|---|---|---|---|---|")
    for label, sc, n, field in floors:
        raw, rawf = get(sc, "raw", n, field), get(sc, "raw-fred", n, field)
        ours, fred = get(sc, "redlease/redis", n, field), get(sc, "redlease/fred", n, field)
        print(f"| {label} | {fmt(raw)} | {fmt(rawf)} | {fmt(ours)} | {r3(ratio(ours, raw))} | {fmt(fred)} "
              f"| {r3(ratio(fred, raw))} | {r3(ratio(fred, rawf))} |")
    for label, field in [("S6 bytes per lease, batched", "bytes_per_lease"),
                         ("S6 CPU µs per renewal, batched", "cpu_us_per_renewal")]:
        raw, rawf = get("S6", "raw", 1, field), get("S6", "raw-fred", 1, field)
        ours, fred = get("S6", "redlease/redis+batch", 1, field), get("S6", "redlease/fred+batch", 1, field)
        print(f"| {label} | | | {fmt(ours)} | {r3(ratio(ours, raw))} | {fmt(fred)} | {r3(ratio(fred, raw))} "
              f"| {r3(ratio(fred, rawf))} |")
    s7 = get("S7", "redlease/memory", None, "allocs_per_op")
    print()
    print(f"S7: {fmt(s7)} heap allocations per try_acquire + release on the in-memory node.")
    print()

    peers = [
        ("S1 p50", "S1", 1, "p50_us"),
        ("S2 3-node p50", "S2", 3, "p50_us"),
        ("S2 5-node p50", "S2", 5, "p50_us"),
        ("S10 3-node p50", "S10", 3, "p50_us"),
        ("S10 5-node p50", "S10", 5, "p50_us"),
        ("S3 pairs/s", "S3", 1, "ops_per_s"),
        ("S4 p50, one node silent", "S4", 3, "p50_us"),
        ("S6 bytes per lease", "S6", 1, "bytes_per_lease"),
        ("S6 CPU per renewal", "S6", 1, "cpu_us_per_renewal"),
    ]
    print("| figure | redlease/redis | ÷ raw | ÷ rslock | ÷ distributed-lock-redis | ÷ async-redis-lock "
          "| redlease/fred ÷ raw / rslock / d-l-r / a-r-l |")
    print("|---|---|---|---|---|---|---|")
    for label, sc, n, field in peers:
        ours, fred = get(sc, "redlease/redis", n, field), get(sc, "redlease/fred", n, field)
        others = ["raw"] + PEERS
        mine = " | ".join(r3(ratio(ours, get(sc, o, n, field))) for o in others)
        theirs = " / ".join(r3(ratio(fred, get(sc, o, n, field))) for o in others)
        print(f"| {label} | {fmt(ours)} | {mine} | {theirs} |")
    print()

    impls = ["raw", "redlease/redis", "redlease/fred", "rslock", "distributed-lock-redis", "async-redis-lock"]
    print("| S9 case | nodes | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for case in ["S9/64/0ms", "S9/64/1ms", "S9/8/0ms", "S9/8/1ms"]:
        for n in [1, 3]:
            cells = []
            for imp in impls:
                row = rows.get((case, imp, n))
                if row is None or row.get("ops_per_s") is None:
                    cells.append("–")
                else:
                    spread = row.get("spread_pct")
                    cells.append(f"{fmt(row['ops_per_s'], 0)} ({spread:.0f} %)" if spread is not None
                                 else fmt(row["ops_per_s"], 0))
            print(f"| {case} | {n} | " + " | ".join(cells) + " |")
    print()

    impls = ["raw", "redlease/redis", "redlease/fred", "rslock", "distributed-lock-redis"]
    print("| S10 | nodes | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for n in [3, 5]:
        cells = []
        for imp in impls:
            p50, p99 = get("S10", imp, n, "p50_us"), get("S10", imp, n, "p99_us")
            cells.append("–" if p50 is None else f"{fmt(p50)} / {fmt(p99)}")
        print(f"| p50 / p99 µs | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench/full.json")
