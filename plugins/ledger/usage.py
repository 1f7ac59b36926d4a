"""`modelcall usage`: the ledger summed by key, model, UTC day, kind (generate, embed, score) or LoRA adapter."""
from __future__ import annotations

import json
import sqlite3
from typing import Any

GROUPS = {"key": "COALESCE(key_name, '-')", "model": "COALESCE(model, '-')",
          "day": "date(COALESCE(received, finished), 'unixepoch')", "kind": "COALESCE(kind, '-')",
          "lora": "COALESCE(lora, '-')"}   # '-': the base model
POOLING_KINDS = ("embed", "score")   # pooling requests: prompt tokens only, told apart from generation


def summarize(conn: sqlite3.Connection, by: str = "key") -> list[dict[str, Any]]:
    """One row per group: requests (served and refused), finish reasons, and tokens by category."""
    if by not in GROUPS:
        raise ValueError(f"--by must be one of {', '.join(GROUPS)}, got {by!r}")
    rows = conn.execute(f"""
        SELECT {GROUPS[by]} AS grp,
               COUNT(*) AS requests,
               SUM(status = 200) AS served,
               SUM(status <> 200) AS refused,
               SUM(prompt_tokens) AS prompt_tokens,
               SUM(cached_tokens) AS cached_tokens,
               SUM(completion_tokens) AS completion_tokens,
               SUM(reasoning_tokens) AS reasoning_tokens,
               SUM(tool_calls) AS tool_calls,
               SUM(CASE WHEN kind IN {POOLING_KINDS} THEN prompt_tokens ELSE 0 END) AS pooling_tokens
        FROM requests GROUP BY grp ORDER BY grp""").fetchall()
    out = []
    for r in rows:
        d = dict(r)
        d[by] = d.pop("grp")
        d["total_tokens"] = (d["prompt_tokens"] or 0) + (d["completion_tokens"] or 0)
        reasons = conn.execute(f"SELECT finish_reason, COUNT(*) FROM requests WHERE {GROUPS[by]} = ? "
                               "GROUP BY finish_reason ORDER BY finish_reason", (d[by],)).fetchall()
        d["finish_reasons"] = {k or "-": n for k, n in reasons}
        kinds = conn.execute(f"SELECT COALESCE(kind, '-'), SUM(prompt_tokens) FROM requests WHERE {GROUPS[by]} = ? "
                             "GROUP BY 1 ORDER BY 1", (d[by],)).fetchall()
        d["prompt_tokens_by_kind"] = {k: n for k, n in kinds}
        out.append(d)
    return out


def render(rows: list[dict[str, Any]], by: str, as_json: bool) -> str:
    if as_json:
        return json.dumps(rows, indent=2)
    if not rows:
        return "the ledger has no requests yet"
    cols = (by, "requests", "served", "refused", "prompt_tokens", "cached_tokens", "completion_tokens",
            "reasoning_tokens", "total_tokens", "tool_calls", "pooling_tokens")
    table = [cols] + [tuple(str(r[c] if r[c] is not None else 0) for c in cols) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.append("cached_tokens are part of prompt_tokens; reasoning_tokens are part of completion_tokens; "
                 "pooling_tokens are the prompt tokens of embed and score requests (embeddings, rerank, score).")
    return "\n".join(lines)
