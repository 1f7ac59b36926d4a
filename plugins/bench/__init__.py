"""`modelcall bench`: throughput measured through the Kernel, the way a user would run it."""
