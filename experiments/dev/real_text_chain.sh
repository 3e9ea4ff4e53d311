#!/bin/bash
# Issue 53's test seeds, as NOTES 37-39 fix them, in one resumable chain (each step is skipped
# when its output exists, so the script can be started again after a stop):
#   1. the start: every pipeline stage before REALM seed 1, with REALM replaced by a stop;
#   2. rebuild_check against the committed records; the chain goes on only if the retrievers'
#      per-question ranks and the pre-training counts are the committed ones;
#   3. REALM seeds 1, 2, 3, zero-shot rows only (--noopenqa), results kept per seed;
#   4. the same seeds' Open-QA rows (ORQA's model first, then each seed's), results kept per seed.
# usage: experiments/dev/real_text_chain.sh CODE OUT MAIN
#   CODE  a clone of fc79c9e (the test recipe), which runs every stage
#   OUT   the pipeline's --output_dir (e.g. /work/runs/rt53t)
#   MAIN  this repository at a later commit: its venv, MiniLM, rebuild_check and real_text_merge
# A seed whose zero-shot rows MAIN has committed is not run again (NOTES 40: a new machine each
# session). With COMMIT=1, each seed's zero-shot rows are merged into MAIN and committed as soon
# as they are written, since a session may end minutes later.
# Run it niced, one CPU-heavy job at a time: nice -n 19 experiments/dev/real_text_chain.sh ...
set -euo pipefail
CODE=$(realpath "$1"); OUT=$2; MAIN=$(realpath "$3")
PY=$MAIN/.venv/bin/python
FLAGS=(--output_dir="$OUT" --squad_file="$CODE/assets/squad/dev-v1.1.json.gz"
       --vocab_file="$CODE/assets/vocab/bert-base-uncased-vocab.txt"
       --wiki_dump="$CODE/assets/wikipedia/enwiki-shortened.xml.bz2"
       --minilm_dir="$MAIN/assets/minilm")
say() { echo "$(date -u +%FT%TZ) $*"; }
in_code() { (cd "$CODE" && PYTHONPATH="$CODE" "$PY" "$@"); }

if [ ! -e "$OUT/start_done" ]; then
  say "1. the start"
  set +e
  in_code -c 'import sys
from experiments import real_text, text_realm
def stop(*args, **kwargs):
  sys.exit(3)  # REALM seed 1 would start here: the start is built
text_realm.pretrain_realm = stop
sys.argv = ["real_text"] + sys.argv[1:]
real_text.run()' "${FLAGS[@]}" --realm_seeds=1 --noopenqa
  rc=$?; set -e
  [ $rc -eq 3 ] || { say "the start failed: exit $rc"; exit 1; }
  touch "$OUT/start_done"
fi

CHECK=$OUT/rebuild_check.json
if [ ! -e "$CHECK" ]; then
  say "2. rebuild_check"
  (cd "$MAIN" && "$PY" -m experiments.dev.rebuild_check "$OUT/work" "$CHECK.tmp" --same_start)
  mv "$CHECK.tmp" "$CHECK"
fi

committed() { [ -e "$MAIN/experiments/results/real_text_realm_runs/realm_$1_done.json" ]; }
for s in 1 2 3; do
  kept=$OUT/results_zero_shot_seed$s
  if [ ! -e "$kept/real_text_realm.md" ] && ! committed $s; then
    say "3. REALM seed $s, zero-shot rows"
    in_code -m experiments.real_text "${FLAGS[@]}" --realm_seeds=$s --noopenqa
    rm -rf "$kept"; cp -r "$OUT/results" "$kept"
  fi
  if [ "${COMMIT:-0}" = 1 ] && ! committed $s; then
    say "3. REALM seed $s, zero-shot rows merged and committed"
    (cd "$MAIN" && "$PY" -m experiments.real_text_merge "$OUT" $s "$kept" --rows=zero_shot &&
     git add experiments/results && git commit -q -m "Issue 53: REALM test seed $s's zero-shot \
rows (real_text_merge --rows=zero_shot; the chain at fc79c9e committed them as they finished)" \
       -- experiments/results) || say "seed $s: merge or commit failed"
  fi
done

for s in 1 2 3; do
  kept=$OUT/results_openqa_seed$s
  [ -e "$kept/real_text_openqa.md" ] && continue
  # Open-QA rows only from the REALM run whose zero-shot rows these are (real_text_merge checks)
  [ -e "$OUT/work/realm_${s}_done.json" ] || { say "seed $s: no REALM run here, no Open-QA rows"; continue; }
  say "4. REALM seed $s, Open-QA rows"
  in_code -m experiments.real_text "${FLAGS[@]}" --realm_seeds=$s
  rm -rf "$kept"; cp -r "$OUT/results" "$kept"
done
say "done"
