"""``python -m draftmeta.e2e``: the ``draftmeta e2e`` command on its own."""

from __future__ import annotations

import argparse
import sys

from draftmeta.e2e.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` as ``draftmeta e2e``'s arguments and run it; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m draftmeta.e2e")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["e2e", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
