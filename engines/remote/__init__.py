"""The remote OpenAI-compatible fallback: the feature (service.py), /api/remote, `traylm remote`."""
