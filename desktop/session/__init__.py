"""The desktop session: start at login, Unix signals, one app per user."""
