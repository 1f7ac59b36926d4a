"""Built-in reasoning parsers: `<think>` blocks, blocks the template opens in the prompt, the `enable_thinking` switch."""
