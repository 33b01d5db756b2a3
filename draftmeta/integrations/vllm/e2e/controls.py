"""Negative controls: a deliberately wrong draft-step update, injected into one engine.

Before every draft step after the first, vLLM's older proposer (vLLM 0.32's
``SpecDecodeBaseProposer._update_positions_dependent_metadata``) advances the draft state that
attention reads: the sequence lengths, the slot each request's new key and value go to, the
positions the model embeds (RoPE), and the host ``max_seq_len``. A metadata update that forgets
one of them is the bug draftmeta exists to prevent. Each control here undoes one part of that
advance, from draft index ``first_index`` on (2 by default: the steps draftmeta's plugin updates
in place in this proposer), so the part stays at the value it had at the draft index before,
for the rest of the draft loop:

* ``seq-lens``: the sequence lengths are not advanced (attention misses the newest keys);
* ``slot-mapping``: the slot mapping is not advanced (the new key and value overwrite the
  previous step's, and attention reads a slot nobody wrote);
* ``positions``: the positions are not advanced (RoPE rotates the query and the new key for
  an earlier position; from the step after, the slots vLLM derives from them go stale too);
* ``max-seq-len``: the host ``max_seq_len`` is not advanced.

The metadata the plugin and vLLM's builders produce reads these (CPU_MLA's sequence lengths and
slot mapping are views of them, its ``max_seq_len`` a copy), so the control is what a wrong
update would hand attention. Install :func:`injected` only around what the plugin-on engine
does (:func:`draftmeta.integrations.vllm.e2e.engine.plugin_session` with a control): the other
engine keeps vLLM's correct loop, and the comparison must catch the difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import attrs

from draftmeta.integrations.patching import Patches

__all__ = ["CAUGHT_DRAFT_SHARE", "CAUGHT_LENGTH_DROP", "CONTROLS", "Control", "Verdict",
           "caught", "injected", "verdict"]

CAUGHT_LENGTH_DROP = 0.25
"""A control is caught when vLLM's mean acceptance length with it falls by at least this share
of the length without it (3.6 -> 2.7 or lower), ..."""

CAUGHT_DRAFT_SHARE = 0.10
"""... or when at least this share of the draft tokens compared differ from the plugin-off
engine's. Both margins were fixed before the controls' first run in an engine."""


Verdict = Literal["caught", "inert", "missed"]
"""What a negative control's run showed: ``caught`` (it differs by a stated margin), ``inert``
(nothing the draft model computed changed, to the bit: the backend does not read what the
control left stale, so no bug there can matter to it), ``missed`` (it changed the drafts, by
less than the margins)."""


def verdict(length_off: float | None, length_on: float | None, differing: int, compared: int,
            hidden_max_abs_difference: float | None) -> Verdict:
    """The verdict on one negative control's run (see :data:`Verdict`)."""
    if caught(length_off, length_on, differing, compared):
        return "caught"
    if compared and not differing and hidden_max_abs_difference == 0.0:
        return "inert"
    return "missed"


def caught(length_off: float | None, length_on: float | None, differing: int,
           compared: int) -> bool:
    """Whether a negative control's run differs from the correct one by a stated margin
    (:data:`CAUGHT_LENGTH_DROP` or :data:`CAUGHT_DRAFT_SHARE`); never when nothing was
    compared."""
    if not compared:
        return False
    dropped = (length_off is not None and length_on is not None
               and length_on <= length_off * (1 - CAUGHT_LENGTH_DROP))
    return dropped or differing >= CAUGHT_DRAFT_SHARE * compared


@attrs.frozen
class Control:
    """One deliberately wrong update.

    Attributes:
        name: its name on the command line (``seq-lens``).
        wrong: what it leaves stale, in words.
    """

    name: str
    wrong: str


CONTROLS: dict[str, Control] = {c.name: c for c in (
    Control("seq-lens", "sequence lengths not advanced"),
    Control("slot-mapping", "slot mapping stale"),
    Control("positions", "positions stale"),
    Control("max-seq-len", "host max_seq_len stale"),
)}
"""The controls by name, in the order the end-to-end run reports them."""


def _snapshot(proposer: Any, metadata: Any, name: str, batch_size: int,
              input_batch_size: int) -> Callable[[], None]:
    """Save the part ``name`` of the draft state; the returned function puts it back."""
    if name == "seq-lens":
        seq_lens = metadata.seq_lens
        saved = seq_lens.clone()
        return lambda: seq_lens.copy_(saved)
    if name == "slot-mapping":
        slots = proposer._slot_mapping_buffer[:input_batch_size]
        saved_slots = slots.clone()
        return lambda: slots.copy_(saved_slots)
    if name == "positions":
        positions = (proposer.mrope_positions[:, :batch_size] if proposer.uses_mrope
                     else proposer.positions[:batch_size])
        saved_positions = positions.clone()
        return lambda: positions.copy_(saved_positions)
    if name == "max-seq-len":
        value = metadata.max_seq_len

        def restore() -> None:
            metadata.max_seq_len = value

        return restore
    raise ValueError(f"unknown negative control {name!r}; choose from {', '.join(CONTROLS)}")


@contextlib.contextmanager
def injected(name: str, first_index: int = 2) -> Iterator[None]:
    """While active, vLLM's older proposer leaves the part ``name`` of the draft state stale
    from draft index ``first_index`` on (see the module docs).

    Raises:
        ValueError: ``name`` is no control of :data:`CONTROLS`, or ``first_index`` < 1.
    """
    if name not in CONTROLS:
        raise ValueError(f"unknown negative control {name!r}; choose from {', '.join(CONTROLS)}")
    if first_index < 1:
        raise ValueError(f"draft index 1 is the first the proposer advances to; got {first_index}")
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    index = {"draft": 0}
    propose = SpecDecodeBaseProposer.propose
    advance = SpecDecodeBaseProposer._update_positions_dependent_metadata

    def counting_propose(proposer: Any, *args: Any, **kwargs: Any) -> Any:
        index["draft"] = 0
        return propose(proposer, *args, **kwargs)

    def wrong_advance(proposer: Any, positions: Any, metadata: Any, batch_size: int,
                      input_batch_size: int, *args: Any, **kwargs: Any) -> Any:
        index["draft"] += 1  # the draft index this advance prepares
        if index["draft"] < first_index:
            return advance(proposer, positions, metadata, batch_size, input_batch_size, *args,
                           **kwargs)
        restore = _snapshot(proposer, metadata, name, batch_size, input_batch_size)
        advanced = advance(proposer, positions, metadata, batch_size, input_batch_size, *args,
                           **kwargs)
        restore()
        return advanced

    with Patches() as patches:
        patches.replace(SpecDecodeBaseProposer, "propose", counting_propose)
        patches.replace(SpecDecodeBaseProposer, "_update_positions_dependent_metadata",
                        wrong_advance)
        yield
