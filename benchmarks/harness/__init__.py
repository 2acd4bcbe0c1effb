"""The shared code of every benchmark: results (`report`), inputs (`corpus`), timing and the one
percentile function (`timing`), HTTP calls (`http_calls`), processes (`servers`), the load generator
(`loadgen`), the machine's own load (`machine`), the gateway's cost without a model (`gateway`),
engine timing on a GPU (`engine_bench`) and the figures (`plots`).

Scripts under `suites/` and `studies/` put `benchmarks/` on `sys.path` and import from here; no
script imports another script.
"""
