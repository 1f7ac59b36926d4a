"""The built-in model runner: Hugging Face model definitions over modelcall's paged KV cache."""
