"""Built-in tool-call parsers: Hermes/Qwen tags, Llama 3 JSON, Mistral `[TOOL_CALLS]`, pythonic lists."""
