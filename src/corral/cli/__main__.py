"""``python -m corral.cli``: the ``corral`` command without the installed script (tests and benchmarks start the
server this way)."""

from corral.cli import main

if __name__ == "__main__":
    main()
