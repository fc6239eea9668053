#!/usr/bin/env bash
# Mutation testing of the modules that hold zoo's invariants (issue #18), with cosmic-ray.
#
#   scripts/mutation.sh                 every area: mutation/*.toml
#   scripts/mutation.sh engine gates    only those areas
#   scripts/mutation.sh --report AREA   print the last session's report (survivors listed) again
#
# Each area's config names the modules it mutates and the tests that state their invariants.
# cosmic-ray applies one mutation at a time to the file on disk, runs the test command and
# restores the file; this script refuses to start on modules with uncommitted changes and puts
# them back from git however it ends. Sessions are kept in mutation/<area>.sqlite (ignored by
# git), so an interrupted run resumes. Far too slow for CI (every mutant runs its tests): CI
# only checks that every config loads and names modules and tests that exist
# (tests/test_mutation_config.py). The figures and the survivors, with why each is equivalent,
# are in docs/mutation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PATH="$PWD/$BIN:$PATH"  # the configs' test commands say `python`: the project's
[[ -x $BIN/cosmic-ray ]] || ./dev setup

if [[ ${1:-} == --report ]]; then
  shift
  for area in "$@"; do "$BIN/cr-report" "mutation/$area.sqlite" --show-output; done
  exit 0
fi

areas=("$@")
if [[ ${#areas[@]} -eq 0 ]]; then
  for f in mutation/*.toml; do areas+=("$(basename "$f" .toml)"); done
fi

modules_of() {  # the module paths a config mutates, one a line
  "$BIN/python" - "$1" <<'PY'
import sys
from cosmic_ray.config import load_config
paths = load_config(sys.argv[1])["module-path"]
print("\n".join([paths] if isinstance(paths, str) else paths))
PY
}

for area in "${areas[@]}"; do
  cfg=mutation/$area.toml
  db=mutation/$area.sqlite
  [[ -f $cfg ]] || { echo "no such area: $area (configs: mutation/*.toml)" >&2; exit 2; }
  mapfile -t modules < <(modules_of "$cfg")
  if ! git diff --quiet -- "${modules[@]}"; then
    echo "$area: uncommitted changes in ${modules[*]}; commit or stash them first (cosmic-ray edits these files)" >&2
    exit 2
  fi
  trap 'git checkout -q -- "${modules[@]}"' EXIT
  echo "== $area: ${modules[*]}"
  if [[ ! -f $db ]]; then
    "$BIN/cosmic-ray" init "$cfg" "$db"
    "$BIN/python" scripts/mutation_skip_annotations.py "$db"  # equivalent by construction
  fi
  "$BIN/cosmic-ray" baseline "$cfg"   # the tests must pass on the unmutated code
  "$BIN/cosmic-ray" exec "$cfg" "$db"
  git checkout -q -- "${modules[@]}"
  trap - EXIT
  "$BIN/cr-report" "$db" | grep -E "^(total jobs|complete|surviving mutants)" || true
  echo "   survivors: scripts/mutation.sh --report $area"
done
