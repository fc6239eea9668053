#!/usr/bin/env bash
# Regenerate every shipped lockfile after a change to code a kind imports (every key moves):
# each recipe natively on a fresh run cache and zoo (this host's class), then the x86-64-avx2
# records under QEMU (scripts/lock_emulated.sh) — alexnet in the background, the small recipes
# beside it. Expect about 20 min native and 75-90 min for alexnet's emulation on 2 cores.
#
#   scripts/regen_locks.sh            (progress in lock-regen/status; logs beside it)
#   scripts/regen_locks.sh --native-only
#                                     this host's records only: the other classes' records are
#                                     dropped with the old locks (a record whose keys no longer
#                                     match is a claim nothing backs), to be rebuilt by a full run
#
# bert-tiny-text, transformers-distilbert-languages and pydoc-llama get native records only: their training
# under emulation takes hours (README "Lockfiles per platform"). Then update the README
# quickstart's figures from a fresh clone.
set -uo pipefail
cd "$(dirname "$0")/.."
native_only=0
[[ ${1:-} == --native-only ]] && native_only=1
out=lock-regen
mkdir -p "$out"
status=$out/status
: > "$status"
small=(lenet-digits lenet-digits-finetune tabular-mlp digits-nonsquare sobel-edges sklearn-gbdt-breast-cancer
       lightgbm-breast-cancer xgboost-breast-cancer keras-mlp-breast-cancer jax-mlp-breast-cancer)
native=("${small[@]}" bert-tiny-text transformers-distilbert-languages pydoc-llama alexnet)

rm -f recipes/*.lock
home=$(mktemp -d) cache=$(mktemp -d)
for r in "${native[@]}"; do
  s=$(date +%s)
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ZOO_HOME=$home ZOO_CACHE_DIR=$cache .venv/bin/zoo run "recipes/$r.yaml" > "$out/native-$r.log" 2>&1
  rc=$?
  echo "native $r rc=$rc $(( $(date +%s) - s ))s" >> "$status"
  [[ $rc == 0 ]] || { echo "FAILED (see $out/native-$r.log)" >> "$status"; exit 1; }
done
rm -rf "$home" "$cache"
if [[ $native_only == 1 ]]; then echo DONE >> "$status"; exit 0; fi

( s=$(date +%s); nice -n 5 bash scripts/lock_emulated.sh recipes/alexnet.yaml > "$out/emulated-alexnet.log" 2>&1
  echo "emulated alexnet rc=$? $(( $(date +%s) - s ))s" >> "$status" ) &
s=$(date +%s)
paths=()
for r in "${small[@]}"; do paths+=("recipes/$r.yaml"); done
bash scripts/lock_emulated.sh "${paths[@]}" > "$out/emulated-small.log" 2>&1
echo "emulated small rc=$? $(( $(date +%s) - s ))s" >> "$status"
wait
echo DONE >> "$status"
