"""The HTTP gateway: OpenAI-compatible API, tokenization, fan-out to server replicas. Never imports torch."""
