"""The core control API: engine start/stop, status, profiles, settings, engine envs, events."""
