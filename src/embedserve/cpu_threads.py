"""How PyTorch's CPU threads (GNU OpenMP) spin at every barrier by default. Where another process also
uses the cores, a spinning thread burns the time slice the thread it waits for needs. Measured
on 2 CPU cores, all-MiniLM-L6-v2, offline encode of 192 passages beside one busy process
(benchmarks/cpu_neighbour.py and its first trials): waiting passively made our encode 1.24x to
1.67x faster than spinning (sentence-transformers, in the same processes, 1.16x to 1.23x); we
stayed ahead of sentence-transformers either way (1.18x to 1.70x). Quiet, the two policies were
within the machine's noise. So the offline API waits passively.

The server keeps OpenMP's default: for `serve` at 16 clients the two were within this machine's
noise (benchmarks/omp_serve_cpu.py: spinning 125-129 requests/s, passive 118-146, alternating
rounds), so the server's behaviour was left as it was.

OpenMP reads the policy once, when torch is loaded: it only counts before that. A value the
user set is kept (an empty one means OpenMP's default).
"""

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
