#!/usr/bin/env bash
# Run every benchmarks/bench_*.py with its defaults: RESULTS/<name>.json (+ <name>.log with the table).
#   benchmarks/run_all.sh [RESULTS]      (default benchmarks/results/; PYTHON=... picks the interpreter)
# Extra arguments after RESULTS go to every script (e.g. --threads 1). Exit status 1 if any failed.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out="${1:-$here/results}"
shift $(( $# > 0 ? 1 : 0 ))
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
mkdir -p "$out"

# the known benchmarks first, in this order, then any other bench_*.py
scripts=()
for name in train capture probes sae scaling; do
    [[ -f "$here/bench_$name.py" ]] && scripts+=("$here/bench_$name.py")
done
for f in "$here"/bench_*.py; do
    [[ -f "$f" ]] || continue
    case " ${scripts[*]} " in *" $f "*) ;; *) scripts+=("$f") ;; esac
done

failed=()
for f in "${scripts[@]}"; do
    name="$(basename "$f" .py)"; name="${name#bench_}"
    echo "== $name -> $out/$name.json"
    start=$SECONDS
    if "$PYTHON" "$f" --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
        echo "== $name done in $(( SECONDS - start )) s"
    else
        echo "== $name FAILED (see $out/$name.log)"
        failed+=("$name")
    fi
done
if (( ${#failed[@]} )); then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all ${#scripts[@]} benchmarks done -> $out"
