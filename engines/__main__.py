"""`python -m engines` is the `traylm` command."""

from engines.cli import main

if __name__ == "__main__":
    main()
