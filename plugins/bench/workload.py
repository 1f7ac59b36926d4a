"""The benchmark workload format: JSONL rows of {"prompt_token_ids": [...], "max_tokens": N}."""
from __future__ import annotations

import json
from typing import Any


def load_rows(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return rows
