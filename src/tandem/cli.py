"""Command-line entry point (filled in as the layers land)."""

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print("tandem: no commands yet", argv)
    return 0
