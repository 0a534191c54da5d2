"""TensorRT-LLM: engine builds, the engine cache, the launch hook and its checks."""
