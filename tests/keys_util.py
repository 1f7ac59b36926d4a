"""Helpers for the security tests: write an API-key file with hashed keys."""
from __future__ import annotations

import hashlib
from pathlib import Path


def write_keys(path: Path, keys: dict[str, dict]) -> Path:
    """`keys`: plain key -> fields (name, models, rpm, …). Only the sha256 goes into the file."""
    lines = []
    for plain, fields in keys.items():
        lines.append("[[keys]]")
        lines.append(f'sha256 = "{hashlib.sha256(plain.encode()).hexdigest()}"')
        for k, v in fields.items():
            if isinstance(v, str):
                lines.append(f'{k} = "{v}"')
            elif isinstance(v, list):
                lines.append(f"{k} = [{', '.join(repr(x).replace(chr(39), chr(34)) for x in v)}]")
            else:
                lines.append(f"{k} = {v}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path
