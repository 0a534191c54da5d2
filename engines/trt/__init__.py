"""TensorRT-LLM engine builds, the engine cache, GPU facts, and the engines feature."""
