"""The daemon's plumbing, shared by every part: event bus, SQLite store, processes,
private files, log filters, metrics, HTTP helpers, reachability, the one-daemon lock, and a
model's config.json."""
