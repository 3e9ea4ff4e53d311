#!/bin/bash
# Issue 53's test seeds, as NOTES 37-40 fix them, in one resumable chain (each step is skipped
# when its output exists, or when MAIN has committed its rows, so the script can be started
# again after a stop or on a new machine):
#   1. the start: every pipeline stage before REALM, with REALM replaced by a stop;
#   2. rebuild_check against the committed records; the chain goes on only if the retrievers'
#      per-question ranks and the pre-training counts are the committed ones;
#   3. STEPS in order, each kept in OUT/results_<step>: zN, REALM seed N's zero-shot rows
#      (--noopenqa); oN, seed N's Open-QA rows (ORQA's model first, the first time), only where
#      seed N's REALM run is in OUT, since they must come from the run whose zero-shot rows
#      are committed (real_text_merge checks). Default STEPS="z1 z2 z3 o1 o2 o3".
# With COMMIT=1, each step's rows are merged into MAIN and committed as soon as they are
# written, since a session may end minutes later (NOTES 40: a new machine each session).
# usage: [STEPS="z1 z2 o2"] [COMMIT=1] experiments/dev/real_text_chain.sh CODE OUT MAIN
#   CODE  a clone of fc79c9e (the test recipe), which runs every stage
#   OUT   the pipeline's --output_dir (e.g. /work/runs/rt53t)
#   MAIN  this repository at a later commit: its venv, MiniLM, rebuild_check and real_text_merge
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

RUNS=$MAIN/experiments/results/real_text/real_text_realm_runs
for step in ${STEPS:-z1 z2 z3 o1 o2 o3}; do
  s=${step#?}
  case $step in
    z*) rows=zero_shot; flags=(--noopenqa); done_file=realm_${s}_done.json; page=realm ;;
    o*) rows=openqa; flags=(); done_file=realm_${s}_openqa_done.json; page=openqa ;;
    *) say "unknown step $step"; exit 1 ;;
  esac
  [ -e "$RUNS/$done_file" ] && { say "$step: committed already"; continue; }
  kept=$OUT/results_$step
  if [ ! -e "$kept/real_text_$page.md" ]; then
    if [ $rows = openqa ] && [ ! -e "$OUT/work/realm_${s}_done.json" ]; then
      say "$step: seed $s's REALM run is not here, so no Open-QA rows"; continue
    fi
    say "3. $step: REALM seed $s, $rows rows"
    in_code -m experiments.real_text "${FLAGS[@]}" --realm_seeds=$s "${flags[@]}"
    rm -rf "$kept"; cp -r "$OUT/results" "$kept"
  fi
  if [ "${COMMIT:-0}" = 1 ]; then
    say "3. $step: merged and committed"
    (cd "$MAIN" && "$PY" -m experiments.real_text.merge "$OUT" $s "$kept" --rows=$rows &&
     git add experiments/results && git commit -q -m "Issue 53: REALM test seed $s's $rows \
rows (real_text_merge --rows=$rows; the chain at fc79c9e committed them as they finished)" \
       -- experiments/results) || say "$step: merge or commit failed"
  fi
done
say "done"
