"""Developer tools shipped for tests and benchmarks: checkpoint makers. Only `cli` imports them."""
