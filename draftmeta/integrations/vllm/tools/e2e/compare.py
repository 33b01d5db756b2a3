"""Plugin off against plugin on: what one case showed at one batch size, over its engine pairs.

A :class:`Case` is one engine pair's configuration (model, backend, K, and what sets it apart:
vLLM's own hook replaced, an FP8 cache, no CUDA graphs, the A/A control, a negative control).
Each engine of a pair gives a :class:`Side` at each batch size: one *recorded* generate (draft
tokens and hidden states read back), then the *measured* ones (timed, taking turns with the
other engine's) and, on a GPU, one *profiled* one (the GPU's busy time). A :class:`Comparison`
holds a case's sides at one batch size over every pair and says what they show:

* identity: every pair's plugin-on recorded generate, and every later pair's plugin-off one,
  against the first pair's plugin-off one: output tokens, draft tokens (how many differ, of how
  many compared), the draft hidden states (the largest absolute difference) and vLLM's accepted
  drafts per position;
* speed: tok/s of the measured generates, each pair's ratio of medians, the per-generate pairs
  (generate ``i`` of both engines ran in turn), the step time ``T`` (a verification and its draft
  loop), the host time on draft metadata per draft loop, and the GPU's busy time per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from draftmeta.integrations.vllm.tools.e2e.acceptance import Acceptance, total_acceptance
from draftmeta.integrations.vllm.tools.e2e.engine import Generated
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape

if TYPE_CHECKING:
    import torch

__all__ = [
    "Case",
    "Comparison",
    "Pair",
    "Side",
    "draft_token_difference",
    "flat_draft_tokens",
    "hidden_max_abs_difference",
]


def flat_draft_tokens(drafts: Sequence[Sequence[Sequence[int]]]) -> list[int]:
    """Every draft token id of a run's ``propose`` calls (``[call][request][draft step]``), in
    order."""
    return [t for call in drafts for row in call for t in row]


def draft_token_difference(a: Sequence[Sequence[Sequence[int]]],
                           b: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int]:
    """How many draft token ids of two runs differ, call by call and position by position, and
    how many were compared (the longer run's count: a draft only one run made differs)."""
    flat_a, flat_b = flat_draft_tokens(a), flat_draft_tokens(b)
    differing = sum(x != y for x, y in zip(flat_a, flat_b)) + abs(len(flat_a) - len(flat_b))
    return differing, max(len(flat_a), len(flat_b))


def hidden_max_abs_difference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """The largest absolute difference between two runs' draft hidden states, step by step
    (``inf`` where the numbers of steps or a step's shapes differ; 0.0 for two empty runs)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    return max((float((x - y).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)


@attrs.frozen
class Case:
    """One engine pair's configuration.

    Attributes:
        model: the model's name (a key of the run's models).
        backend: vLLM's attention backend.
        k: draft tokens per step.
        override_upstream: plugin on replaces vLLM's own hook (``TRITON_MLA``).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``.
        eager: both engines without CUDA graphs.
        aa: the A/A control: both engines with the plugin off, timed like any case (its ratio
            is the machine's noise).
        control: a negative control on the plugin-on engine (not timed; a key of
            :data:`~draftmeta.integrations.vllm.tools.e2e.controls.CONTROLS`).
    """

    model: str
    backend: str
    k: int
    override_upstream: bool = False
    kv_cache_dtype: str = "auto"
    eager: bool = False
    aa: bool = False
    control: str | None = None

    @property
    def timed(self) -> bool:
        """Whether its generates are timed (a negative control's are not)."""
        return self.control is None

    @property
    def label(self) -> str:
        """``tiny FLASHMLA K=3`` (with ``override``, ``fp8``, ``eager``, ``A/A``, the control as
        they apply)."""
        extra = [x for x, on in (("override", self.override_upstream),
                                 (self.kv_cache_dtype, self.kv_cache_dtype != "auto"),
                                 ("eager", self.eager), ("A/A: both off", self.aa),
                                 (f"control {self.control}", self.control is not None)) if on]
        return " ".join([self.model, self.backend, f"K={self.k}", *extra])


@attrs.frozen
class Side:
    """One engine of a pair at one batch size.

    Attributes:
        recorded: the generate whose draft tokens and hidden states were read back.
        measured: the timed generates, in order (generate ``i`` took turns with the other
            engine's generate ``i``).
        profiled: the generate the GPU's busy time was measured over (GPU runs only).
        startup_seconds: the engine's creation time.
    """

    recorded: Generated
    measured: tuple[Generated, ...] = ()
    profiled: Generated | None = None
    startup_seconds: float = 0.0

    @property
    def median_rate(self) -> float:
        """The measured generates' median tok/s."""
        return statistics.median(g.tokens_per_s for g in self.measured)

    @property
    def deterministic(self) -> bool:
        """Every generate of this engine gave the recorded one's output tokens."""
        others = [*self.measured, *([self.profiled] if self.profiled else [])]
        return all(g.output_tokens == self.recorded.output_tokens for g in others)


@attrs.frozen
class Pair:
    """Both engines of one pair at one batch size (``on`` is the control's run for a negative
    control, and plugin off for the A/A control)."""

    off: Side
    on: Side

    def side(self, name: str) -> Side:
        """The ``"off"`` or ``"on"`` side."""
        if name not in ("off", "on"):
            raise ValueError(f"a pair's sides are 'off' and 'on', not {name!r}")
        return self.off if name == "off" else self.on


def _sum_loops(generates: Sequence[Generated]) -> int:
    return sum(g.observed.loops for g in generates)


@attrs.frozen
class Comparison:
    """One case at one batch size, over every engine pair (module docs).

    Attributes:
        case: the configuration.
        batch_size: prompts per generate.
        pairs: per engine pair, both sides.
        shapes: what vLLM configured in the (off, on) engines' draft loops.
    """

    case: Case
    batch_size: int
    pairs: tuple[Pair, ...]
    shapes: tuple[EngineShape, EngineShape]

    @property
    def reference(self) -> Generated:
        """The first pair's plugin-off recorded generate: what every other is compared with."""
        return self.pairs[0].off.recorded

    @property
    def against(self) -> list[Generated]:
        """The recorded generates compared with :attr:`reference`: every pair's plugin-on one,
        then every later pair's plugin-off one (they must all agree)."""
        return [p.on.recorded for p in self.pairs] + [p.off.recorded for p in self.pairs[1:]]

    @property
    def output_tokens_identical(self) -> bool:
        """Every prompt generated the same tokens in every recorded generate."""
        return all(g.output_tokens == self.reference.output_tokens for g in self.against)

    @property
    def draft_tokens_identical(self) -> bool:
        """Every ``propose`` returned the same draft tokens in every recorded generate."""
        return all(g.observed.draft_tokens == self.reference.observed.draft_tokens
                   for g in self.against)

    @property
    def draft_tokens_counted(self) -> tuple[int, int]:
        """How many draft token ids differ from the reference, and how many were compared, over
        every recorded generate compared."""
        counts = [draft_token_difference(self.reference.observed.draft_tokens,
                                         g.observed.draft_tokens) for g in self.against]
        return sum(d for d, _ in counts), sum(c for _, c in counts)

    @property
    def hidden_max_abs_difference(self) -> float:
        """The largest absolute difference of any compared generate's draft hidden states from
        the reference's (``inf`` where steps or shapes differ)."""
        return max((hidden_max_abs_difference(self.reference.observed.hidden, g.observed.hidden)
                    for g in self.against), default=0.0)

    @property
    def acceptance_identical(self) -> bool:
        """vLLM accepted as many drafts at every position in every recorded generate."""
        return all(g.observed.acceptance == self.reference.observed.acceptance
                   for g in self.against)

    def tile_crossings(self, tile: int) -> tuple[int, int]:
        """Over the drafts a stale kernel schedule can change (a draft step after the loop's
        first at which the request's sequence has entered a new tile of ``tile`` tokens since
        that first step, per the reference's loop lengths), how many differ from the reference
        in the compared generates, and how many there were."""
        reference = self.reference.observed
        differing = compared = 0
        for generate in self.against:
            calls = generate.observed.draft_tokens
            for call, (lengths, ref_rows) in enumerate(zip(reference.loop_lengths,
                                                          reference.draft_tokens)):
                rows = calls[call] if call < len(calls) else []
                for request, (first, ref_row) in enumerate(zip(lengths, ref_rows)):
                    row = rows[request] if request < len(rows) else []
                    for step in range(2, len(ref_row)):
                        if -(-(first + step - 1) // tile) > -(-first // tile):
                            compared += 1
                            differing += step >= len(row) or row[step] != ref_row[step]
        return differing, compared

    @property
    def deterministic(self) -> tuple[bool, bool]:
        """(off, on): every generate of every engine gave its recorded output tokens."""
        return (all(p.off.deterministic for p in self.pairs),
                all(p.on.deterministic for p in self.pairs))

    @property
    def strictly_identical(self) -> bool:
        """Off and on agree in everything compared, and some drafts were compared: output
        tokens, draft tokens, hidden states to the bit, accepted drafts per position."""
        return (self.output_tokens_identical and self.draft_tokens_identical
                and self.draft_tokens_counted[1] > 0 and self.hidden_max_abs_difference == 0.0
                and self.acceptance_identical)

    def acceptance(self, side: str) -> Acceptance:
        """vLLM's acceptance counts of ``side``'s (``"off"``/``"on"``) recorded generates, over
        every pair."""
        return total_acceptance([p.side(side).recorded.observed.acceptance
                                 for p in self.pairs])

    def measured(self, side: str) -> list[Generated]:
        """``side``'s timed generates over every pair, pair by pair."""
        return [g for p in self.pairs for g in p.side(side).measured]

    @property
    def timed(self) -> bool:
        """Whether both sides have timed generates in every pair."""
        return all(p.off.measured and p.on.measured for p in self.pairs)

    @property
    def pair_speedups(self) -> list[float]:
        """Per engine pair, its median tok/s on over its median tok/s off (empty untimed)."""
        if not self.timed:
            return []
        return [p.on.median_rate / p.off.median_rate for p in self.pairs]

    @property
    def speedup(self) -> float | None:
        """The median of :attr:`pair_speedups`; ``None`` untimed."""
        return float(statistics.median(self.pair_speedups)) if self.timed else None

    @property
    def generate_seconds(self) -> tuple[list[float], list[float]]:
        """(off, on): every timed generate's seconds; generate ``i`` of both sides ran in turn
        (the per-generate pairs of :mod:`draftmeta.measure.noise`)."""
        return ([g.seconds for g in self.measured("off")],
                [g.seconds for g in self.measured("on")])

    def step_ms(self, side: str) -> float | None:
        """Wall time per engine step (a verification and its draft loop) over ``side``'s timed
        generates, ms; ``None`` without draft loops."""
        generates = self.measured(side)
        loops = _sum_loops(generates)
        return 1e3 * sum(g.seconds for g in generates) / loops if loops else None

    def host_us_per_loop(self, side: str) -> float | None:
        """Host time on draft metadata per draft loop that ran on the host, over ``side``'s
        timed generates, us; ``None`` where none ran on the host (every loop replayed a
        graph)."""
        generates = self.measured(side)
        loops = sum(g.observed.host_loops for g in generates)
        if not loops:
            return None
        return 1e6 * sum(g.observed.host_seconds for g in generates) / loops

    def host_us_per_step(self, side: str) -> float | None:
        """Host time on draft metadata per engine step (every draft loop counted, those that
        replayed a graph with none), us: the ``s`` of ``s / T``."""
        generates = self.measured(side)
        loops = _sum_loops(generates)
        if not loops:
            return None
        return 1e6 * sum(g.observed.host_seconds for g in generates) / loops

    def gpu_busy_ms_per_step(self, side: str) -> float | None:
        """The GPU's busy time per engine step over ``side``'s profiled generates, ms; ``None``
        where none was profiled."""
        profiled = [g for p in self.pairs if (g := p.side(side).profiled) is not None
                    and g.gpu_busy_seconds is not None]
        loops = sum(g.observed.loops for g in profiled)
        if not loops:
            return None
        return 1e3 * sum(g.gpu_busy_seconds or 0.0 for g in profiled) / loops

    @property
    def limit(self) -> float | None:
        """The most the plugin can gain here: ``T`` off over the plugin-on engine's GPU busy
        time per step (a step cannot take less than its GPU work); ``None`` unprofiled."""
        t_off, busy_on = self.step_ms("off"), self.gpu_busy_ms_per_step("on")
        if t_off is None or not busy_on:
            return None
        return t_off / busy_on

    def gpu_idle_ms(self, side: str) -> float | None:
        """Per step, the time ``side``'s GPU stood idle, waiting for the host: its ``T`` less
        its GPU busy time, ms."""
        step, busy = self.step_ms(side), self.gpu_busy_ms_per_step(side)
        if step is None or busy is None:
            return None
        return step - busy

    @property
    def gpu_idle_ms_off(self) -> float | None:
        """Per step, the time the plugin-off engine's GPU stood idle (:meth:`gpu_idle_ms`)."""
        return self.gpu_idle_ms("off")
