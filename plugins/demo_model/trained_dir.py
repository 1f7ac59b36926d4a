"""Where the trained demo model lives: `trained/` inside this package (package data, read only)."""
from __future__ import annotations

import os

TRAINED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trained")


def trained_model_dir() -> str:
    """The trained demo model's directory (shipped in the package; written by `train.py`)."""
    if not os.path.isfile(os.path.join(TRAINED_DIR, "config.json")):
        raise FileNotFoundError(f"the trained demo model is missing from {TRAINED_DIR}; rebuild it with "
                                "python -m modelcall.plugins.demo_model.train --out " + TRAINED_DIR)
    return TRAINED_DIR


def copy_trained_model(out_dir: str) -> str:
    """Copy the trained demo model into `out_dir` (new or empty). Returns `out_dir`."""
    import shutil
    src = trained_model_dir()
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty; give a new or empty directory")
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(src)):
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
    return out_dir
