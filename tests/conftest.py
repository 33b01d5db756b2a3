"""Test setup: vLLM runs on the CPU here, quietly."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
# vLLM loads general plugins whenever a config is made: keep draftmeta's off, so that tests
# compare against vLLM's own builders; the plugin tests turn it on explicitly
os.environ["DRAFTMETA_VLLM_PLUGIN"] = "0"
# the plugin tests exercise draftmeta's in-place paths, also where one measured slower than
# vLLM's in a real engine (the default then leaves that builder to vLLM: tested on its own)
os.environ["DRAFTMETA_VLLM_FORCE"] = "1"

from draftmeta.backends.vllm_classes import ensure_platform_environment

ensure_platform_environment()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-golden``: rewrite the golden texts (tests/golden) instead of comparing."""
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite tests/golden from the current generators instead of comparing",
    )
