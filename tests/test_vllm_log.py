"""The plugin's line in vLLM's own log (the installed vLLM release, on CPU; a real engine's log is
read in tests/test_e2e.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from draftmeta.integrations.vllm import plugin
from draftmeta.integrations.vllm.catalogue import current_release, installed_version
from draftmeta.integrations.vllm.plugin import log

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

RELEASE = current_release()
_PATH_WORDS = {"older_proposer": "older proposer", "hook": "hook"}


def _plugin_records(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.name == plugin.LOGGER_NAME]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    try:
        yield
    finally:
        plugin.unregister()


def test_the_plugins_logger_is_a_child_of_vllms_logger_so_vllms_handler_writes_its_lines(
) -> None:
    import vllm.logger  # noqa: F401  (vLLM creates its logger; ours may exist before it)

    vllm_logger = logging.getLogger("vllm")
    assert plugin.LOGGER_NAME == "vllm.draftmeta"
    assert plugin.logger.parent is vllm_logger


def test_the_line_names_the_release_the_catalogue_and_per_draft_path_the_builders_covered_and_left(
    fresh: None, vllm_log: list[logging.LogRecord]
) -> None:
    plugin.register()
    info = plugin.installed()
    assert info is not None
    (record,) = _plugin_records(vllm_log)
    assert record.levelno == logging.INFO
    line = record.getMessage()
    assert line.startswith(f"draftmeta on (vLLM {installed_version()}, catalogue "
                           f"{RELEASE.version}): ")
    covered = {"older_proposer": info.older_proposer, "hook": info.hook}
    for path in RELEASE.paths:
        left = sorted(key.split(" ")[0] for key in info.skipped if key.endswith(f"({path})"))
        total = len(covered[path]) + len(left)
        assert (f"{_PATH_WORDS[path]}: {len(covered[path])} of {total} builders by draftmeta, "
                f"left to vLLM: {', '.join(left)}") in line, (path, line)
    assert "DRAFTMETA_VLLM_PLUGIN=0 turns it off" in line


def test_registering_again_in_the_same_process_writes_no_second_line(
    fresh: None, vllm_log: list[logging.LogRecord]
) -> None:
    plugin.register()
    plugin.register()
    assert len(_plugin_records(vllm_log)) == 1


@pytest.fixture
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's ``vllm`` logger as it is before vLLM configures its logging in a process (no
    handler, propagating), and vLLM's record of its last configuration put back afterwards."""
    import vllm.logger

    vllm_logger = logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "handlers", [])
    monkeypatch.setattr(vllm_logger, "propagate", True)
    monkeypatch.setattr(vllm.logger, "_last_configured_logging_config",
                        vllm.logger._last_configured_logging_config)
    yield


def test_a_line_registered_before_vllm_configures_its_logging_is_written_once_when_it_does(
    fresh: None, unconfigured: None, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM loads general plugins in its engine arguments, before it configures its logging;
    the plugin's line waits for that instead of going nowhere. (With ``configure_logging``
    off vLLM installs no handler, so the line propagates to the root logger, where caplog
    reads it.)"""
    import vllm.logger
    from vllm.config.logging import LoggingConfig

    original = vllm.logger._configure_vllm_root_logger
    with caplog.at_level(logging.INFO, logger=plugin.LOGGER_NAME):
        plugin.register()
        assert _plugin_records(caplog.records) == []
        vllm.logger.configure_logging(LoggingConfig(configure_logging=False))
        vllm.logger.configure_logging(LoggingConfig(configure_logging=False, log_level="DEBUG"))
    (record,) = _plugin_records(caplog.records)
    assert record.getMessage().startswith("draftmeta on (vLLM ")
    assert vllm.logger._configure_vllm_root_logger is original  # unwrapped once written


def test_unregister_forgets_a_held_line_and_unwraps_vllms_logging_setup(
    fresh: None, unconfigured: None, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm.logger
    from vllm.config.logging import LoggingConfig

    original = vllm.logger._configure_vllm_root_logger
    with caplog.at_level(logging.INFO, logger=plugin.LOGGER_NAME):
        plugin.register()
        assert vllm.logger._configure_vllm_root_logger is not original  # holding the line
        plugin.unregister()
        assert vllm.logger._configure_vllm_root_logger is original
        vllm.logger.configure_logging(LoggingConfig(configure_logging=False))
    assert _plugin_records(caplog.records) == []


def test_a_fallback_warns_once_per_builder_and_goes_to_debug_after(
    fresh: None, vllm_log: list[logging.LogRecord]
) -> None:
    for _ in range(3):
        log.fallback("CPU_MLA", "draftmeta: %s rebuilds: %s", "CPU_MLA", "why")
    log.fallback("TRITON_MLA", "draftmeta: %s rebuilds: %s", "TRITON_MLA", "why")
    levels = [(r.getMessage(), r.levelno) for r in _plugin_records(vllm_log)]
    assert levels == [("draftmeta: CPU_MLA rebuilds: why", logging.WARNING),
                      ("draftmeta: CPU_MLA rebuilds: why", logging.DEBUG),
                      ("draftmeta: CPU_MLA rebuilds: why", logging.DEBUG),
                      ("draftmeta: TRITON_MLA rebuilds: why", logging.WARNING)]
    plugin.unregister()  # a new registration warns afresh
    log.fallback("CPU_MLA", "draftmeta: %s rebuilds: %s", "CPU_MLA", "again")
    assert _plugin_records(vllm_log)[-1].levelno == logging.WARNING
