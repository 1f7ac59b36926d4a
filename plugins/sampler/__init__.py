"""The built-in batched sampler: greedy, temperature, top-k/top-p/min-p, seeds, penalties, logprobs."""
