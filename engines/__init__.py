"""traylm's headless core: daemon, engines, gateway, telemetry, hub. Never imports Qt."""

__version__ = "0.1.0"
