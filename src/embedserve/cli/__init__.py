"""The command line: `embedserve embed | rerank | models | index | serve | server | gateway | make-checkpoint`."""
