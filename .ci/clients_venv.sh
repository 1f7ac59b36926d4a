#!/usr/bin/env bash
# The virtualenv of the clients whose pins conflict with the test extra's (instructor 1.17: openai 3.3,
# jiter<0.15; guidellm 0.8: click 8.4, multidict<7; the NOTEs in tests/test_client_{instructor,guidellm}.py).
# Usage: .ci/clients_venv.sh DIR
#
# NOTE: as plugin_examples/run_all.sh does, the venv sees the project venv's packages (modelcall, torch,
# pytest...) through a .pth that calls site.addsitedir, and pip installs only what the two clients pin into
# the venv's own site-packages, which come first on sys.path: there openai is 3.3.0, in .venv it stays
# 3.60. Measured on this 2-core machine, shared: 42 s, against 1 min 49 s for a venv that installs torch and
# the project again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
venv_py="$root/.venv/bin/python"
rm -rf "$dir"
"$venv_py" -m venv "$dir"
project_site=$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$project_site')" > "$site/modelcall-project-venv.pth"
"$dir/bin/pip" install -q instructor==1.17.0 guidellm==0.8.1
# the venv's own copies win: fail here, not in the tests, if the overlay did not take
"$dir/bin/python" - "$site" <<'PY'
import sys
import openai, multidict
for mod in (openai, multidict):
    assert mod.__file__.startswith(sys.argv[1]), f"{mod.__name__} comes from {mod.__file__}, not the clients venv"
PY
