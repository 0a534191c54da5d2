"""The first-run setup: from nothing to a chat answer (desktop/setup/dialog.py)."""
