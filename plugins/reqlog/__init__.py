"""The request log: one structured JSON line per finished request; no prompt, output or key material by default."""
