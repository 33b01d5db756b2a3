"""Test setup: vLLM runs on the CPU here, quietly."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
# vLLM loads general plugins whenever a config is made: keep draftmeta's off, so that tests
# compare against vLLM's own builders; the plugin tests turn it on explicitly
os.environ["DRAFTMETA_VLLM_PLUGIN"] = "0"
# the plugin tests exercise draftmeta's in-place paths, also where one measured slower than
# vLLM's in a real engine (the default then leaves that builder to vLLM: tested on its own)
os.environ["DRAFTMETA_VLLM_FORCE"] = "1"

from draftmeta.integrations.vllm.catalogue.classes import ensure_platform_environment

ensure_platform_environment()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-golden``: rewrite the golden texts (tests/golden) instead of comparing."""
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite tests/golden from the current generators instead of comparing",
    )


class _Capture(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def e2e_floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``benchmarks/e2e_floor.py`` imported as a module (and forgotten afterwards)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import e2e_floor as module

    yield module
    sys.modules.pop("e2e_floor", None)


@pytest.fixture
def vllm_log() -> Iterator[list[logging.LogRecord]]:
    """What reaches vLLM's ``vllm`` logger (DEBUG and up), with vLLM's logging configured as
    an engine configures it (``configure_logging_if_needed(LoggingConfig())``, which vLLM's
    engine arguments call too, so it is not configured again under the capture)."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(LoggingConfig())
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    records: list[logging.LogRecord] = []
    capture = _Capture(records)
    vllm_logger.addHandler(capture)
    vllm_logger.setLevel(logging.DEBUG)  # vLLM's own handler keeps its level (ERROR here)
    try:
        yield records
    finally:
        vllm_logger.removeHandler(capture)
        vllm_logger.setLevel(level)


@pytest.fixture(autouse=True)
def _specs_declared_afresh_under_mutmut() -> None:
    """Under mutmut (``nox -s mutation``, which sets ``MUTANT_UNDER_TEST``) every test declares
    its specs afresh: a spec cached by an earlier test (or at collection, before the mutant was
    switched on) would hide a mutant of the function that declares it, and mutmut would tie
    that function only to the first test that called it."""
    if "MUTANT_UNDER_TEST" in os.environ:
        from draftmeta.advance import advance_spec
        from draftmeta.registry import clear_spec_caches

        clear_spec_caches()
        advance_spec.cache_clear()
