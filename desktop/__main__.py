"""``python -m desktop`` opens the tray app (the same as ``traylm`` with no arguments)."""

import sys

from desktop.app import main

sys.exit(main(sys.argv[1:]))
