#!/usr/bin/env bash
# A scratch copy of the working tree whose code the main venv imports instead of the editable install:
#   scripts/scratch_copy.sh /tmp/scratch           # copy (tracked and untracked files, no .venv/.git)
#   cd /tmp/scratch && <break something> && \
#     PYTHONPATH=/tmp/scratch/_ns OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_x.py
# Why it works: the editable install maps modelcall.core -> <repo>/core with a meta-path finder that
# sys.meta_path asks after the ordinary path finder, and `modelcall` is a namespace package; so a
# `modelcall/` folder on PYTHONPATH (here _ns/modelcall, with links to the copy's core/, events/,
# plugins/, testing/) is found first and every `modelcall.*` import, entry points included, loads the copy.
# Check: PYTHONPATH=<copy>/_ns python -c 'import modelcall.core; print(modelcall.core.__file__)'
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dst="${1:?usage: scratch_copy.sh DEST}"
mkdir -p "$dst"
(cd "$src" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$dst"
mkdir -p "$dst/_ns/modelcall"
for part in core events plugins testing; do
  ln -sfn "$dst/$part" "$dst/_ns/modelcall/$part"
done
echo "PYTHONPATH=$dst/_ns"
