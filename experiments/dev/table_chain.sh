#!/bin/bash
# Table seeds one after another, each committed as soon as it is written (issue 54 item 4: a
# session may end, and the machine be replaced, minutes later; only what is committed stays).
# A seed whose file MAIN has committed is skipped, so the chain can be started again after a
# stop or on a new machine; a seed stopped midway left no number and starts over.
# usage: [COMMIT=1] experiments/dev/table_chain.sh CODE OUT MAIN RESULTS SEED...
#   CODE     a clone of the pre-registered commit, which runs every seed (one code fingerprint)
#   OUT      where the seeds' runs go (OUT/seedN)
#   MAIN     this repository: its venv, and where the seed files are committed
#   RESULTS  the seed files' folder, relative to the repository (experiments/results/...)
# Run it niced, one CPU-heavy job at a time: nice -n 19 experiments/dev/table_chain.sh ...
set -euo pipefail
CODE=$(realpath "$1"); OUT=$(realpath -m "$2"); MAIN=$(realpath "$3"); RESULTS=$4; shift 4
PY=$MAIN/.venv/bin/python
say() { echo "$(date -u +%FT%TZ) $*"; }
mkdir -p "$OUT/results" "$MAIN/$RESULTS"
for seed in "$@"; do
  file=seed$seed.json
  if (cd "$MAIN" && git ls-files --error-unmatch "$RESULTS/$file" >/dev/null 2>&1); then
    say "seed $seed: committed already"; continue
  fi
  if [ ! -e "$OUT/results/$file" ]; then
    say "seed $seed: running"
    rm -rf "$OUT/seed$seed"
    (cd "$CODE" && PYTHONPATH="$CODE" "$PY" -m experiments.tables --seed="$seed" \
       --output_dir="$OUT/seed$seed" --results_dir="$OUT/results" --progress_seconds=300)
  fi
  cp "$OUT/results/$file" "$MAIN/$RESULTS/$file"
  if [ "${COMMIT:-0}" = 1 ]; then
    (cd "$MAIN" && git add "$RESULTS/$file" && git commit -q -m "Issue 54: test seed $seed \
($(cd "$CODE" && git rev-parse --short HEAD), committed by the chain as it finished)" \
       -- "$RESULTS/$file") && say "seed $seed: committed" || say "seed $seed: commit failed"
  fi
done
say "done"
