"""modelcall.plugins: the built-in stage implementations and front ends, each a plugin like any other."""
