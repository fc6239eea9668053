#!/usr/bin/env bash
# Add a recipe's lock records for another x86-64 CPU class than this host's, by building it under
# one of QEMU's CPU models (user-mode emulation: Debian's qemu-user, which ./dev installs).
#
#   scripts/lock_emulated.sh [--cpu MODEL] RECIPE.yaml...      (default MODEL: EPYC-Milan)
#
# Why this is honest: torch and onnxruntime choose their kernels by what CPUID says, and QEMU's
# model says exactly that CPU's features (EPYC-Milan = AMD Zen 3: AVX2 + FMA, no AVX-512), so the
# stage workers run that class's kernels, and zoo files their records under the class CPUID gives
# (zoo/cpuid.py), with the model's name ("AMD EPYC-Milan Processor") as the recorded CPU. QEMU
# computes each instruction's IEEE result exactly; it was checked against real hardware: at commit
# c9a788e, whose lenet-digits.lock a real AVX2 host (AMD Zen 3) wrote, this script's run
# reproduced every stage's output digest bit for bit, where a native run on the AVX-512 host
# produced another checkpoint (README "Lockfiles per platform").
#
# Every stage runs (an empty run cache and zoo in a temporary folder), in emulation: expect 20-50x
# the native time. The recipe's lockfile keeps its other classes' records; the run fails unless
# every stage's record for the emulated class is there afterwards (so a stage that ran natively,
# which would have filed its record under this host's class, cannot go unnoticed).
set -euo pipefail
cd "$(dirname "$0")/.."

cpu=EPYC-Milan
if [[ ${1:-} == --cpu ]]; then cpu=$2; shift 2; fi
[[ $# -gt 0 ]] || { sed -n '2,6p' "$0" >&2; exit 2; }
qemu=$(command -v qemu-x86_64) || { echo "qemu-x86_64 not found: apt-get install qemu-user (./dev does)" >&2; exit 2; }
python=$(pwd)/.venv/bin/python
[[ -x $python ]] || { echo "no .venv: run ./dev setup first" >&2; exit 2; }

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# the stage workers are spawned processes (multiprocessing): they must start under QEMU too
cat > "$work/python" <<EOF
#!/bin/sh
exec "$qemu" -cpu "$cpu" "$python" "\$@"
EOF
chmod +x "$work/python"
mkdir "$work/site"
cat > "$work/site/sitecustomize.py" <<EOF
import multiprocessing
multiprocessing.set_executable("$work/python")
EOF

klass=$(PYTHONPATH="$(pwd)" "$work/python" -c "from zoo import host; print(host.platform_class())" 2>/dev/null)
echo "[lock_emulated] QEMU model $cpu: platform class $klass (this host: $("$python" -c "from zoo import host; print(host.platform_class())"))"

for recipe in "$@"; do
  echo "[lock_emulated] $recipe"
  # QEMU warns about host-only CPUID bits it cannot emulate on every start: not errors
  PYTHONPATH="$work/site:$(pwd)" ZOO_HOME="$work/home" ZOO_CACHE_DIR="$work/cache" \
    "$work/python" -m zoo run "$recipe" 2> >(grep -v "TCG doesn't support requested feature" >&2)
  "$python" - "$recipe" "$klass" <<'EOF'
import sys
from pathlib import Path

import yaml

recipe, klass = Path(sys.argv[1]), sys.argv[2]
lock = yaml.safe_load(recipe.with_suffix(".lock").read_text())
stages = yaml.safe_load(recipe.read_text())["stages"]
have = set((lock.get("platforms") or {}).get(klass) or {})
missing = sorted(s for s in stages if not any(r == s or r.startswith(f"{s}[") for r in have))
if missing:
    sys.exit(f"{recipe}: no {klass} records for {', '.join(missing)} (did a stage run outside the emulator?)")
print(f"[lock_emulated] {recipe.with_suffix('.lock')}: {klass} records for {len(have)} stages")
EOF
done
