"""One model across paired boxes on vLLM's own multi-node launch (issue 24, item 3)."""
