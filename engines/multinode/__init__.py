"""One model across paired boxes on vLLM's own multi-node launch."""
