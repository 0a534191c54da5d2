"""Models on demand: every profile, library model and attached server is addressable by name at
:8000; a request loads its model (single flight), idle models unload, and a planner places
models on the GPUs by each engine's memory rule. See docs/architecture/flows/load.md."""
