"""The ledger: one SQLite row per model request (who, what, when, how much), written off the hot path."""
