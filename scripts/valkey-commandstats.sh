#!/usr/bin/env bash
# Server-side cost per lease operation on Valkey 9.1, native commands vs the Lua scripts: INFO commandstats
# usec_per_call after N calls of each (run from the repository root after scripts/fetch-valkey.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# The scripts' sources, read from adapters/src/scripts/ (so this never drifts from the code).
eval "$(python3 - <<'PY'
import glob, re, shlex
s = ''.join(open(f).read() for f in sorted(glob.glob('adapters/src/scripts/*.rs')))
src = {m.group(1): m.group(2) for m in re.finditer(r'pub const (\w+): Script = Script \{\n    name: "[^"]*",\n    source: r#"(.*?)"#', s, re.S)}
for var, name in [('EXT', 'EXTEND'), ('REL', 'RELEASE'), ('FEN', 'ACQUIRE_FENCED')]:
    print(f"{var}={shlex.quote(src[name])}")
PY
)"
V=.cache/valkey/9.1.2/valkey-server; P=$((30000 + RANDOM % 5000)); $V --port $P --save '' --appendonly no >/dev/null 2>&1 & pid=$!; sleep 0.5
c() { redis-cli -p $P "$@"; }
T=0123456789abcdef0123456789abcdef01234567; N=20000
ES=$(c SCRIPT LOAD "$EXT"); RS=$(c SCRIPT LOAD "$REL"); FS=$(c SCRIPT LOAD "$FEN")
c SET k $T PX 100000 >/dev/null
c CONFIG RESETSTAT >/dev/null
c -r $N EVALSHA $ES 1 k $T 30000 >/dev/null
c INFO commandstats | grep -E "cmdstat_evalsha" | sed 's/^/extend script: /'
c CONFIG RESETSTAT >/dev/null
c -r $N SET k $T IFEQ $T PX 30000 >/dev/null
c INFO commandstats | grep -E "cmdstat_set:" | sed 's/^/extend native: /'
# release: DEL a key that holds another value (compare fails: no write) to measure the compare cost alone, and a real delete
c CONFIG RESETSTAT >/dev/null
c -r $N EVALSHA $RS 1 k other >/dev/null
c INFO commandstats | grep -E "cmdstat_evalsha" | sed 's/^/release script (not ours): /'
c CONFIG RESETSTAT >/dev/null
c -r $N DELIFEQ k other >/dev/null
c INFO commandstats | grep -E "cmdstat_delifeq" | sed 's/^/release native (not ours): /'
# real releases: alternate SET then release (the SET's cost is reported separately)
c CONFIG RESETSTAT >/dev/null
for i in $(seq 2000); do printf 'SET k %s\nEVALSHA %s 1 k %s\n' $T $RS $T; done | c >/dev/null
c INFO commandstats | grep -E "cmdstat_evalsha" | sed 's/^/release script (deletes): /'
c CONFIG RESETSTAT >/dev/null
for i in $(seq 2000); do printf 'SET k %s\nDELIFEQ k %s\n' $T $T; done | c >/dev/null
c INFO commandstats | grep -E "cmdstat_delifeq" | sed 's/^/release native (deletes): /'
# fenced: script vs the three native steps (each acquisition then deleted with DEL)
c CONFIG RESETSTAT >/dev/null
for i in $(seq 2000); do printf 'EVALSHA %s 2 l f %s 30000\nDEL l\n' $FS $T; done | c >/dev/null
c INFO commandstats | grep -E "cmdstat_evalsha" | sed 's/^/fenced script: /'
c CONFIG RESETSTAT >/dev/null
for i in $(seq 2000); do printf 'MULTI\nGET f\nPTTL f\nEXEC\nSET l %s NX PX 30000\nMULTI\nINCR f\nGET l\nPTTL f\nEXEC\nDEL l\n' $T; done | c >/dev/null
c INFO commandstats | grep -E "cmdstat_(multi|exec|get|pttl|set|incr):" | sed 's/^/fenced native: /'
kill "$pid"
