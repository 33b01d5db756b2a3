"""Negative controls: a deliberately wrong draft-step update, injected into one engine.

A control runs on a plugin-on engine and its drafts are compared with the plugin-off engine's
for the same prompts: it must be *caught*, by a margin stated before any run
(:data:`CAUGHT_LENGTH_DROP`, :data:`CAUGHT_DRAFT_SHARE`), or be *inert* (nothing the draft model
computed moved, to the bit: the backend does not read what the control left stale). Two kinds:

* on the CPU engine, a part of the older proposer's draft state left stale (below);
* on a GPU, ``stale-scheduler``: the shipped spec of ``FLASHMLA`` or ``FLASH_ATTN_MLA`` with the
  kernel schedule left ``Unchanged`` between draft steps (the bug draftmeta exists to prevent:
  a forgotten field), given to the plugin-on engine at its creation.

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
does (:func:`draftmeta.integrations.vllm.tools.e2e.engine.plugin_session` with a control): the other
engine keeps vLLM's correct loop, and the comparison must catch the difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

from draftmeta.integrations.patching import Patches

if TYPE_CHECKING:
    from draftmeta.advance import HostBound
    from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
    from draftmeta.spec import DraftSpec

__all__ = ["CAUGHT_DRAFT_SHARE", "CAUGHT_LENGTH_DROP", "CONTROLS", "FLASHMLA_TILE",
           "SCHEDULED_BACKENDS", "Control", "Verdict", "caught", "controls_for", "injected",
           "judged", "stale_scheduler_spec", "tile_of", "verdict"]

CAUGHT_LENGTH_DROP = 0.25
"""A control is caught when vLLM's mean acceptance length with it falls by at least this share
of the length without it (3.6 -> 2.7 or lower), ..."""

CAUGHT_DRAFT_SHARE = 0.10
"""... or when at least this share of the draft tokens compared differ from the plugin-off
engine's. Both margins were fixed before the controls' first run in an engine."""


Verdict = Literal["caught", "inert", "missed", "blind"]
"""What a negative control's run showed: ``caught`` (it differs by a stated margin), ``inert``
(nothing the draft model computed changed, to the bit: the backend does not read what the
control left stale, so no bug there can matter to it), ``missed`` (it changed the drafts, by
less than the margins), ``blind`` (the run held no draft the control can change: a stale
FlashMLA schedule in a run where no draft loop crossed a tile)."""


def verdict(length_off: float | None, length_on: float | None, differing: int, compared: int,
            hidden_max_abs_difference: float | None) -> Verdict:
    """The verdict on one negative control's run (see :data:`Verdict`)."""
    if caught(length_off, length_on, differing, compared):
        return "caught"
    if compared and not differing and hidden_max_abs_difference == 0.0:
        return "inert"
    return "missed"


def tile_of(control: str, backend: str) -> int | None:
    """The scheduler tile a control can act through on ``backend``, where it acts only on draft
    loops that cross one (FlashMLA's stale schedule: :data:`FLASHMLA_TILE`), else ``None``."""
    if control == "stale-scheduler" and backend == "FLASHMLA":
        return FLASHMLA_TILE
    return None


def judged(length_off: float | None, length_on: float | None, differing: int, compared: int,
           hidden_max_abs_difference: float | None,
           crossings: tuple[int, int] | None = None) -> Verdict:
    """The verdict on one negative control's run: :func:`verdict` over every draft; and for a
    control that may act only where a draft loop crosses a scheduler tile (``crossings``: the
    drafts after such a crossing that differ, and how many there were), also ``caught`` when at
    least :data:`CAUGHT_DRAFT_SHARE` of those differ, and ``blind`` where nothing changed and no
    loop crossed a tile (the run could not see the control)."""
    overall = verdict(length_off, length_on, differing, compared, hidden_max_abs_difference)
    if crossings is None or overall == "caught":
        return overall
    crossed_differing, crossed = crossings
    if crossed and crossed_differing >= CAUGHT_DRAFT_SHARE * crossed:
        return "caught"
    if overall == "inert" and not crossed:
        return "blind"
    return overall


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


FLASHMLA_TILE = 64
"""The tokens per tile of FlashMLA's scheduler (its 64-token KV blocks): a request's share of the
schedule changes only when its sequence enters a new tile."""

SCHEDULED_BACKENDS = ("FLASHMLA", "FLASH_ATTN_MLA")
"""The backends whose metadata holds a kernel schedule draftmeta refreshes every draft step:
FlashMLA's scheduler object and FA3's ahead-of-time scheduler metadata."""


@attrs.frozen
class Control:
    """One deliberately wrong update.

    Attributes:
        name: its name (``seq-lens``).
        wrong: what it leaves stale, in words.
        device: the platform whose draft loop it breaks (``"cpu"``, ``"cuda"``).
        min_k: the smallest K where it can show (its stale part matters from a draft step that
            a loop of K - 1 steps must reach).
        backends: the backends it applies to (empty: every backend of its device).
        wrong_spec: a spec given to the plugin-on engine at its creation (a fresh engine);
            else the control is held around the plugin-on engine's generate (:func:`injected`).
    """

    name: str
    wrong: str
    device: str = "cpu"
    min_k: int = 3
    backends: tuple[str, ...] = ()
    wrong_spec: bool = False

    def applies(self, device: str, backend: str, k: int) -> bool:
        """Whether this control can show on ``backend`` at ``k`` on ``device``."""
        return (device == self.device and k >= self.min_k
                and (not self.backends or backend in self.backends))


CONTROLS: dict[str, Control] = {c.name: c for c in (
    Control("seq-lens", "sequence lengths not advanced"),
    Control("slot-mapping", "slot mapping stale"),
    Control("positions", "positions stale"),
    Control("max-seq-len", "host max_seq_len stale"),
    # its wrong spec leaves the schedule of draft step 1 in place for steps 2..: a loop needs
    # K - 1 >= 2 draft steps to show it (K = 2 has one, freshly built)
    Control("stale-scheduler", "kernel schedule left stale by a wrong spec", device="cuda",
            backends=SCHEDULED_BACKENDS, wrong_spec=True),
)}
"""The controls by name, in the order the end-to-end run reports them."""


def controls_for(device: str) -> tuple[str, ...]:
    """The names of the controls of ``device``'s draft loop (what ``--negative-control``
    runs)."""
    return tuple(name for name, c in CONTROLS.items() if c.device == device)


def stale_scheduler_spec(backend: str = "FLASHMLA") -> BuilderSpecFactory:
    """The ``stale-scheduler`` control's spec factory for ``backend`` (one of
    :data:`SCHEDULED_BACKENDS`): its shipped spec with the decode part's scheduler left
    ``Unchanged`` between draft steps. FlashMLA's steps 2.. then replay step 1's tile schedule
    over grown sequence lengths; FA3's captured draft steps read whatever schedule the buffer
    held before the loop.

    Raises:
        ValueError: ``backend`` has no scheduler draftmeta refreshes.
    """
    if backend not in SCHEDULED_BACKENDS:
        raise ValueError(f"{backend} has no kernel schedule to leave stale; the negative "
                         f"control is for {' and '.join(SCHEDULED_BACKENDS)}")

    def spec(*, name: str, host_bound: HostBound = "frozen", dcp: bool = False,
             builder: Any = None) -> DraftSpec[Any]:
        from draftmeta.integrations.vllm.catalogue import current_release
        from draftmeta.rules import Unchanged
        from draftmeta.spec import DraftSpec

        real = current_release().entry(name).make_spec(host_bound=host_bound, dcp=dcp,
                                                       builder=builder)
        rules = dict(real.rules)
        for path in [p for p in rules if p.startswith("decode.scheduler_metadata")]:
            del rules[path]
        rules["decode.scheduler_metadata"] = Unchanged()
        nested = {p: c for p, c in real.nested.items()
                  if not p.startswith("decode.scheduler")}
        return DraftSpec(real.cls, rules, name=f"{name}.stale_scheduler",
                         preconditions=real.preconditions, nested=nested, dtypes=real.dtypes,
                         attributes=real.attributes)

    return spec


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
    raise ValueError(f"unknown negative control {name!r}; choose from "
                     f"{', '.join(controls_for('cpu'))}")


@contextlib.contextmanager
def injected(name: str, first_index: int = 2) -> Iterator[None]:
    """While active, vLLM's older proposer leaves the part ``name`` of the draft state stale
    from draft index ``first_index`` on (see the module docs).

    Raises:
        ValueError: ``name`` is no control of :data:`CONTROLS`, or ``first_index`` < 1.
    """
    if name not in CONTROLS or CONTROLS[name].wrong_spec:
        raise ValueError(f"unknown negative control {name!r}; choose from "
                         f"{', '.join(controls_for('cpu'))}")
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
