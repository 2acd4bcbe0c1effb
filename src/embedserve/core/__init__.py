"""The request core: inputs, prompts, truncation, windows, token budgets and the output head.

Pure Python and NumPy (tokenizers for tokenization): no torch, no grpc. Every front end (the
offline API, the gateway, the CLI) runs the same core."""
