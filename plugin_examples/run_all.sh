#!/usr/bin/env bash
# Install each plugin example into its own scratch venv and run its tests against the installed copy;
# then install all of them together and check that `modelcall plugins` lists each one.
#
# The scratch venvs see the project venv's packages (modelcall, torch, pytest, ...) through a .pth
# file that calls site.addsitedir, so installing an example takes a second instead of minutes.
# Usage: plugin_examples/run_all.sh [example-dir-name ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv_py="$root/.venv/bin/python"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
project_site=$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

new_venv() {  # new_venv DIR: a venv without pip that imports the project venv's packages
  "$venv_py" -m venv --without-pip "$1"
  local site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$project_site')" > "$site/modelcall-project-venv.pth"
}

install() {  # install VENV EXAMPLE_DIR: from a copy, so no build litter lands in the tree
  local copy="$scratch/src/$(basename "$2")"
  rm -rf "$copy" && mkdir -p "$scratch/src" && cp -r "$2" "$copy"
  rm -rf "$copy/build" "$copy"/*.egg-info
  "$1/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index "$copy"
}

if [ $# -gt 0 ]; then names=("$@"); else
  names=(); for d in "$root"/plugin_examples/*/; do [ -f "$d/pyproject.toml" ] && names+=("$(basename "$d")"); done
fi
run_example() {  # run_example NAME: its own venv, its install, its tests
  local dir="$root/plugin_examples/$1"
  # NOTE: run from the scratch folder, so the tests import the installed module, not the source file.
  new_venv "$scratch/venv-$1" && install "$scratch/venv-$1" "$dir" &&
    (cd "$scratch" && "$scratch/venv-$1/bin/python" -m pytest -q -p no:cacheprovider "$dir/tests")
}

# NOTE: EXAMPLE_JOBS examples at a time (default 2, CI's cores): each is one process at a time, most of it the
# import of torch and transformers, and nothing is shared but the project venv, read only. Each example's output
# is held in its own log and printed in order when it ends.
jobs_max=${EXAMPLE_JOBS:-2}
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  (if run_example "$name" >"$scratch/$name.log" 2>&1; then echo 0; else echo 1; fi >"$scratch/$name.rc") &
done
wait
failed=()
for name in "${names[@]}"; do
  echo "== $name"
  cat "$scratch/$name.log"
  [ "$(cat "$scratch/$name.rc")" = 0 ] || failed+=("$name")
done

echo "== all examples in one venv"
new_venv "$scratch/venv-all"
for name in "${names[@]}"; do install "$scratch/venv-all" "$root/plugin_examples/$name"; done
(cd "$scratch" && "$scratch/venv-all/bin/python" - "${names[@]}" <<'PY'
import json, subprocess, sys
from importlib import metadata
# What an author sees: `modelcall plugins --json` (the same listing as GET /-/plugins), run as the console
# script runs it (this venv borrows the project's packages, not its scripts).
cli = [sys.executable, "-c", "import sys; from modelcall.plugins.cli.main import main; sys.exit(main())"]
listing = json.loads(subprocess.run([*cli, "plugins", "--json"], check=True, capture_output=True, text=True).stdout)
rows = {p["name"]: p for p in listing["plugins"]}
examples = [ep for ep in metadata.entry_points(group="modelcall") if ep.dist.name != "modelcall"]
wrong = [ep.name for ep in examples if ep.name not in rows or rows[ep.name]["version"] != ep.dist.version]
print(f"listed {len(examples)} example plugins:", ", ".join(sorted(ep.name for ep in examples)))
for stage, s in listing["stages"].items():
    print(f"  {stage:<18} {s['provider']}")
if wrong or len(examples) < len(sys.argv) - 1:
    print("not listed, or listed with the wrong version:", wrong)
    sys.exit(1)
PY
) || failed+=("listing")

if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}"; exit 1; fi
echo "plugin examples: all passed"
