#!/usr/bin/env bash
# Build the wheel, install it into a scratch venv that sees the project venv's dependencies,
# and import every subpackage from outside the repository: catches packages missing from the wheel.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv_py="$root/.venv/bin/python"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$venv_py" -m pip wheel -q --no-deps -w "$scratch/dist" "$root"
"$venv_py" -m venv --system-site-packages "$scratch/venv"
# the scratch venv inherits site-packages of the interpreter, not of .venv: point it there
site=$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
scratch_site=$("$scratch/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$scratch_site/project-deps.pth"
"$scratch/venv/bin/pip" install -q --no-deps --no-index "$scratch"/dist/modelcall-*.whl
cd "$scratch"
"$scratch/venv/bin/python" - "$root" <<'PY'
import importlib, pathlib, pkgutil, sys
root = pathlib.Path(sys.argv[1])
missing = []
for top, folder in (("modelcall.core", "core"), ("modelcall.events", "events"), ("modelcall.plugins", "plugins"),
                    ("modelcall.testing", "testing")):
    for init in sorted((root / folder).rglob("__init__.py")):
        rel = init.parent.relative_to(root / folder)
        name = ".".join([top, *rel.parts])
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            missing.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if "site-packages" not in (mod.__file__ or "") and ".venv" not in (mod.__file__ or ""):
            pass
        if str(root) in (mod.__file__ or ""):
            missing.append(f"{name}: imported from the repository, not the wheel ({mod.__file__})")
# the C kernels are compiled from their .c/.h files on first use: each must be package data of the wheel
installed = pathlib.Path(importlib.import_module("modelcall.core").__file__).parent.parent
for folder in ("core", "plugins"):
    for src in sorted((root / folder).rglob("csrc/*")):
        if src.suffix in (".c", ".h") and not (installed / src.relative_to(root)).is_file():
            missing.append(f"{src.relative_to(root)}: not in the wheel (package-data in pyproject.toml)")
if missing:
    print("wheel check FAILED:\n  " + "\n  ".join(missing)); sys.exit(1)
print("wheel check: every subpackage imports from the installed wheel")
PY
