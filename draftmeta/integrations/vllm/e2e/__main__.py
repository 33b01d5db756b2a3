"""``python -m draftmeta.integrations.vllm.e2e``: the ``draftmeta e2e`` command on its own, with
the same arguments, output and quiet defaults (``-v`` for vLLM's and torch's log lines and
warnings)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``draftmeta e2e`` with ``argv`` (the process's arguments if ``None``); returns the
    exit code."""
    from draftmeta.cli import main as draftmeta

    return draftmeta(["e2e", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
