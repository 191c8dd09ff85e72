"""Real vLLM engines (CPU build) run beside kvscope: their environment, servers and the demo."""
