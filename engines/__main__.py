"""``python -m engines ...`` is the ``traylm`` command (the tray app starts the daemon this way)."""

from engines.cli import main

main()
