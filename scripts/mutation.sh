#!/usr/bin/env bash
# Mutation testing (mutmut) of the KV cache, scheduler and sampler plugins and the core modules they
# use, against their fast unit tests; prints the score. Not part of `make test` (minutes, not seconds).
#
#   scripts/mutation.sh                 # the working tree as it is (tracked and untracked files)
#   MUTATION_TREE=head scripts/mutation.sh      # the committed tree; needs a venv whose installed entry
#                                               # points name no plugin that HEAD lacks
#   MUTATION_JOBS=2 MUTATION_DIR=/tmp/x MUTATION_CFG=other.cfg scripts/mutation.sh
#
# mutmut rewrites the files it mutates, so it runs in a scratch copy laid out as the code is imported:
# <dir>/modelcall/{core,events,plugins,testing} and <dir>/tests. mutmut puts its mutants/ folder first
# on sys.path; `modelcall` is a namespace package and the editable install's finder comes after the
# path finder, so the tests import the mutated copy, and the mutant names mutmut derives from file
# paths (modelcall.core.params.x_...) equal the modules' __module__. Scope and tests:
# scripts/mutation/setup.cfg.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${MUTATION_DIR:-${TMPDIR:-/tmp}/modelcall-mutation}"
jobs="${MUTATION_JOBS:-2}"
py="$repo/.venv/bin"

rm -rf "$dir"
mkdir -p "$dir/stage" "$dir/modelcall"
if [ "${MUTATION_TREE:-working}" = working ]; then
  (cd "$repo" && git ls-files -co --exclude-standard -z -- core events plugins testing tests pyproject.toml \
     | tar --null -T - -cf -) | tar -xf - -C "$dir/stage"
else
  git -C "$repo" archive HEAD core events plugins testing tests pyproject.toml | tar -xf - -C "$dir/stage"
fi
for part in core events plugins testing; do mv "$dir/stage/$part" "$dir/modelcall/$part"; done
mv "$dir/stage/tests" "$dir/stage/pyproject.toml" "$dir/"
rmdir "$dir/stage"
cp "${MUTATION_CFG:-$repo/scripts/mutation/setup.cfg}" "$dir/setup.cfg"

cd "$dir"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
start=$(date +%s)
"$py/mutmut" run --max-children "$jobs" > mutmut-run.log 2>&1 || { tail -40 mutmut-run.log; exit 1; }
"$py/mutmut" export-cicd-stats > /dev/null
"$py/mutmut" results --all true > mutmut-results.txt 2>&1 || "$py/mutmut" results > mutmut-results.txt 2>&1 || true
"$py/python" - "$(( $(date +%s) - start ))" <<'PY'
import json, sys
s = json.load(open("mutants/mutmut-cicd-stats.json"))
tested = s["killed"] + s["survived"] + s.get("timeout", 0) + s.get("suspicious", 0)
caught = s["killed"] + s.get("timeout", 0)
print(json.dumps(s))
print(f"mutation score {caught}/{tested} = {100 * caught / max(1, tested):.1f}% "
      f"(killed or timed out, of the mutants some test ran; {s.get('no_tests', 0)} had no test) in {sys.argv[1]} s")
PY
echo "survivors: $dir/mutmut-results.txt (mutmut show NAME in $dir shows one)"
