"""Built-in speculative proposers: prompt lookup (`ngram`) and suffix decoding (`suffix`)."""
