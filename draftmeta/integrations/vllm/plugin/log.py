"""The plugin's lines in vLLM's own log: its format, its stream, its level.

The plugin logs on :data:`LOGGER_NAME` (``vllm.draftmeta``), a child of the ``vllm`` logger
that vLLM configures (``vllm.logger``: one handler, vLLM's format, ``VLLM_LOGGING_LEVEL``,
``VLLM_LOGGING_STREAM``, ``VLLM_CONFIGURE_LOGGING``, a logging config file), so its lines look
like vLLM's and go where vLLM's go::

    INFO 12-04 06:12:01 [log.py:117] draftmeta on (vLLM 0.32.0, catalogue 0.32): ...

What it says, per process that loads the plugin:

* :func:`announce` at :func:`~draftmeta.integrations.vllm.plugin.register`: one line, on
  (:func:`summary`), off (``DRAFTMETA_VLLM_PLUGIN=0``) or left untouched (with the reason).
  vLLM loads general plugins in its engine arguments, before it configures its logging in that
  process; such a line is held and written right after vLLM configures it (the first call of
  ``vllm.logger._configure_vllm_root_logger``), so it is neither lost nor formatted differently.
* :func:`fallback` at run time: one WARNING per builder and process the first time it falls
  back to vLLM's rebuild (a refused object, a shadow-mode mismatch, a spec that does not fit),
  with the reason; later fallbacks of that builder go to DEBUG (the plugin's
  :func:`~draftmeta.integrations.vllm.plugin.stats` counts them). Nothing is logged per step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from draftmeta.integrations.vllm.plugin.plan import Plan

__all__ = [
    "LOGGER_NAME",
    "announce",
    "fallback",
    "logger",
    "reset",
    "summary",
    "vllm_logging_configured",
]

LOGGER_NAME = "vllm.draftmeta"
"""The plugin's logger: a child of vLLM's ``vllm`` logger, so vLLM's handler writes its lines."""

logger = logging.getLogger(LOGGER_NAME)

_lock = threading.Lock()
_held: list[tuple[int, str, tuple[object, ...]]] = []
_warned: set[str] = set()
_restore: Callable[[], None] | None = None


def summary(plan: Plan) -> str:
    """The plugin's one line for ``plan``: vLLM's release, the catalogue, and per draft path how
    many builders draftmeta covers and which ones it leaves to vLLM (each path named in its
    declared :attr:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind.words`)."""
    parts = []
    for path in plan.paths:
        decisions = plan.on(path)
        ours = [d.entry.name for d in decisions if d.installs]
        left = sorted(d.entry.name for d in decisions if not d.installs)
        parts.append(f"{path.words}: {len(ours)} of {len(decisions)} builders by "
                     f"draftmeta, left to vLLM: {', '.join(left) or 'none'}")
    return (f"draftmeta on (vLLM {plan.version}, catalogue {plan.release.version}): "
            + "; ".join(parts) + " ('draftmeta coverage' says why; DRAFTMETA_VLLM_PLUGIN=0 "
            "turns it off)")


def vllm_logging_configured() -> bool:
    """Whether vLLM's ``vllm`` logger has been set up in this process (a handler, or
    propagation turned off by a logging config): a line logged now reaches vLLM's log."""
    root = logging.getLogger("vllm")
    return bool(root.handlers) or not root.propagate


def announce(level: int, msg: str, *args: object) -> None:
    """Log one line of :func:`~draftmeta.integrations.vllm.plugin.register` in vLLM's log:
    now if vLLM's logging is configured in this process, else right after vLLM configures it."""
    if not vllm_logging_configured():
        with _lock:
            if _hold_until_configured():
                _held.append((level, msg, args))
                return
    logger.log(level, msg, *args)


def _hold_until_configured() -> bool:
    """Wrap vLLM's logging set-up so that held lines are written right after it (once);
    whether lines can be held (vLLM's set-up function exists here). Called with the lock."""
    global _restore
    if _restore is not None:
        return True
    try:
        import vllm.logger as vllm_logger
    except Exception:  # no vLLM logging to wait for: log through Python's logging now
        return False
    original: Any = getattr(vllm_logger, "_configure_vllm_root_logger", None)
    if not callable(original):
        return False

    def _configure_vllm_root_logger(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _release()
        return result

    def restore() -> None:
        if vllm_logger.__dict__.get("_configure_vllm_root_logger") is (
                _configure_vllm_root_logger):
            vllm_logger._configure_vllm_root_logger = original

    vllm_logger._configure_vllm_root_logger = _configure_vllm_root_logger
    _restore = restore
    return True


def _release() -> None:
    """Write the held lines (vLLM has just configured its logging) and unwrap vLLM's set-up."""
    global _restore
    with _lock:
        held = list(_held)
        _held.clear()
        restore, _restore = _restore, None
    if restore is not None:
        restore()
    for level, msg, args in held:
        logger.log(level, msg, *args)


def fallback(builder: str, msg: str, *args: object) -> None:
    """A builder fell back to vLLM's rebuild: one WARNING the first time per builder name and
    process (``msg % args`` says why), DEBUG after that."""
    with _lock:
        first = builder not in _warned
        _warned.add(builder)
    logger.log(logging.WARNING if first else logging.DEBUG, msg, *args)


def reset() -> None:
    """Forget held lines and warned builders, and unwrap vLLM's logging set-up (the plugin's
    :func:`~draftmeta.integrations.vllm.plugin.unregister`)."""
    global _restore
    with _lock:
        _held.clear()
        _warned.clear()
        restore, _restore = _restore, None
    if restore is not None:
        restore()
