"""API keys: a TOML file of hashed keys, constant-time checks, per-key models, tools and quotas."""
