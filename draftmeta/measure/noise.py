"""The noise rule every benchmark applies: paired ratios, the A/A control, and one verdict.

A benchmark on a shared machine cannot keep other processes off the cores it measures on, so
every benchmark of draftmeta (``draftmeta bench``, ``draftmeta e2e``, ``benchmarks/e2e_floor.py``)
measures the same way and judges its ratios by the same rule, this module:

1. **Pairs.** The baseline (vLLM's own code: its rebuild, the plugin off) and the candidate
   (draftmeta's update, the plugin on) run as alternating pairs: A B, then B A, then A B, ...,
   so that load which comes and goes falls on both alike. Each pair gives one ratio, candidate
   speed over baseline speed (baseline time / candidate time): above 1.00 the candidate is
   faster. A comparison reports the median of its pair ratios and their min-max
   (:class:`Ratios`).
2. **The A/A control**, where a benchmark has one, runs the same code on both sides of its
   pairs (the e2e's K = 1 rows, where the plugin has nothing to update; ``bench``'s rebuild
   timed against itself). Its pair ratios must straddle 1.00 (lowest <= 1.00 <= highest): if
   every pair of the same code leans one way, the pairing did not cancel what the machine did,
   and the run was **too noisy**: every verdict of the run says so, with how far the control's
   median is from 1.00, instead of faster or slower (:class:`Control`).
3. **The noise** ``n`` of a run is then the largest distance from 1.00 among its control's
   configurations' median ratios. A comparison is **faster** when its median ratio is above
   ``1 + n``, **slower** when it is below ``1 - n``, else **within noise**.
4. **Without a control** (or with one of fewer than :data:`MIN_CONTROL_PAIRS` pairs, or one that
   measures another quantity: the e2e's K = 1 rows have no refresh time) the noise is unknown,
   so a comparison is faster only when every pair is (lowest ratio above 1.00), slower only
   when every pair is (highest below 1.00), else within noise. Rule 2 still applies: a run
   whose control leans one way gives no verdict at all.

So no summary prints a verdict its own A/A control contradicts. :func:`verdict` applies the
rule; :meth:`Verdict.sentence` words it the same way in every report.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import attrs

__all__ = ["MIN_CONTROL_PAIRS", "Control", "Ratios", "Verdict", "VerdictWord", "alternating",
           "pair_ratios", "rate_ratios", "verdict"]

VerdictWord = Literal["faster", "slower", "within noise", "too noisy"]
"""What :func:`verdict` can say about a comparison."""

MIN_CONTROL_PAIRS = 2
"""An A/A control of fewer pairs cannot straddle 1.00 by chance alone (one pair of the same code
is never exactly 1.00): it counts as no control (rule 4)."""


def _positive(values: Iterable[float], what: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    bad = [v for v in out if not v > 0.0 or v == float("inf")]
    if bad:
        raise ValueError(f"{what} must be positive and finite, got {bad}")
    return out


_T = TypeVar("_T")


def alternating(sides: Sequence[_T], runs: int) -> Iterator[tuple[int, _T]]:
    """The order of rule 1: ``(run, side)`` for ``runs`` runs of every side, the sides in their
    order on even runs and reversed on odd ones (A B, B A, A B, ...), so that within each run
    every pair of sides took turns going first. Run ``i`` of every side makes one pair."""
    for run in range(runs):
        for side in (sides if run % 2 == 0 else sides[::-1]):
            yield run, side


def _floats(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@attrs.frozen
class Ratios:
    """The pair ratios of one comparison, candidate speed over baseline speed (one per pair;
    above 1.00 the candidate is faster), with their median and min-max."""

    values: tuple[float, ...] = attrs.field(converter=_floats)

    def __attrs_post_init__(self) -> None:
        if not self.values:
            raise ValueError("a comparison needs at least one pair")
        _positive(self.values, "pair ratios")

    @property
    def median(self) -> float:
        """The median pair ratio: the ratio a report quotes."""
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        """The lowest pair ratio."""
        return min(self.values)

    @property
    def high(self) -> float:
        """The highest pair ratio."""
        return max(self.values)

    @property
    def pairs(self) -> int:
        """How many pairs there were."""
        return len(self.values)

    def as_json(self) -> dict[str, Any]:
        """``{"median", "min", "max", "pairs", "ratios"}``, ratios to 4 decimals."""
        return {"median": round(self.median, 4), "min": round(self.low, 4),
                "max": round(self.high, 4), "pairs": self.pairs,
                "ratios": [round(v, 4) for v in self.values]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ratios:
        """The :class:`Ratios` :meth:`as_json` wrote."""
        return cls(tuple(data["ratios"]))

    def span(self, digits: int = 2) -> str:
        """``median (min-max)`` as a report writes it: ``4.61x (3.90-5.02)``."""
        return (f"{self.median:.{digits}f}x ({self.low:.{digits}f}-{self.high:.{digits}f})")

    @classmethod
    def pooled(cls, groups: Iterable[Ratios]) -> Ratios:
        """Every pair of ``groups`` as one comparison."""
        return cls(tuple(v for g in groups for v in g.values))


def pair_ratios(baseline: Sequence[float], candidate: Sequence[float]) -> Ratios:
    """Pair ratios from times (or costs: lower is better), pair ``i`` being ``baseline[i]``
    and ``candidate[i]``: ``baseline[i] / candidate[i]``.

    Raises:
        ValueError: the sequences differ in length, are empty, or hold a time that is not
            positive.
    """
    if len(baseline) != len(candidate):
        raise ValueError(f"pairs need as many baseline as candidate runs, got {len(baseline)} "
                         f"and {len(candidate)}")
    base = _positive(baseline, "times")
    cand = _positive(candidate, "times")
    return Ratios(tuple(b / c for b, c in zip(base, cand)))


def rate_ratios(baseline: Sequence[float], candidate: Sequence[float]) -> Ratios:
    """Pair ratios from rates (tokens/s: higher is better): ``candidate[i] / baseline[i]``."""
    return pair_ratios(candidate, baseline)


def _ratios(values: Iterable[Ratios]) -> tuple[Ratios, ...]:
    return tuple(values)


@attrs.frozen
class Control:
    """A run's A/A control: the pair ratios of each of its configurations, where both sides ran
    the same code."""

    configurations: tuple[Ratios, ...] = attrs.field(converter=_ratios)

    @property
    def pooled(self) -> Ratios | None:
        """Every pair of the control as one, or ``None`` without any."""
        return Ratios.pooled(self.configurations) if self.configurations else None

    @property
    def usable(self) -> bool:
        """The control has at least :data:`MIN_CONTROL_PAIRS` pairs (else: rule 4)."""
        pooled = self.pooled
        return pooled is not None and pooled.pairs >= MIN_CONTROL_PAIRS

    @property
    def straddles(self) -> bool:
        """Its pairs lie on both sides of 1.00 (or on it): the pairing cancelled the machine's
        load (rule 2)."""
        pooled = self.pooled
        return pooled is not None and pooled.low <= 1.0 <= pooled.high

    @property
    def off_by(self) -> float:
        """How far the control's median (every pair) is from 1.00, as a fraction."""
        pooled = self.pooled
        return 0.0 if pooled is None else abs(pooled.median - 1.0)

    @property
    def noise(self) -> float:
        """The largest distance from 1.00 among the configurations' median ratios (rule 3)."""
        return max((abs(c.median - 1.0) for c in self.configurations), default=0.0)

    def as_json(self) -> dict[str, Any]:
        """The control as a report's JSON gives it: every pair pooled, the noise, whether it
        straddles 1.00, and the medians per configuration."""
        pooled = self.pooled
        return {"pooled": None if pooled is None else pooled.as_json(),
                "configuration_medians": [round(c.median, 4) for c in self.configurations],
                "noise": round(self.noise, 4), "straddles_1": self.straddles,
                "usable": self.usable}

    def sentence(self) -> str:
        """What the control read, in words."""
        pooled = self.pooled
        if pooled is None or not self.usable:
            count = 0 if pooled is None else pooled.pairs
            return (f"the A/A control has {count} pair{'s' if count != 1 else ''}, too few to "
                    "tell this machine's noise")
        medians = [c.median for c in self.configurations]
        shown = (", ".join(f"{m:.2f}x" for m in medians) if len(medians) <= 4
                 else f"{min(medians):.2f}x to {max(medians):.2f}x over {len(medians)}")
        return (f"the A/A control (the same code on both sides) read {pooled.span()} over "
                f"{pooled.pairs} pairs (medians per configuration: {shown})")


@attrs.frozen
class Verdict:
    """What the rule says about one comparison.

    Attributes:
        word: ``faster``, ``slower``, ``within noise`` or ``too noisy``.
        ratio: the comparison's pair ratios.
        noise: the run's noise (rule 3), ``None`` without a usable control.
        too_noisy_by: with ``too noisy``, how far the control's median is from 1.00.
    """

    word: VerdictWord
    ratio: Ratios
    noise: float | None
    too_noisy_by: float | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"verdict", "ratio": {...}, "noise", "too_noisy_by"}``."""
        return {"verdict": self.word, "ratio": self.ratio.as_json(),
                "noise": None if self.noise is None else round(self.noise, 4),
                "too_noisy_by": (None if self.too_noisy_by is None
                                 else round(self.too_noisy_by, 4))}

    def sentence(self) -> str:
        """The verdict and why, in one clause: what every report prints after the ratio."""
        if self.word == "too noisy":
            return (f"no verdict: the machine was too noisy for this ratio (the A/A control's "
                    f"pairs all leaned one way, its median {self.too_noisy_by:.0%} off 1.00)")
        if self.noise is None:
            agree = "every pair agrees" if self.word != "within noise" else (
                "its pairs fall on both sides of 1.00")
            return f"{self.word} ({agree}; no A/A control for this ratio)"
        return f"{self.word} (beyond this run's noise of {self.noise:.0%})" if (
            self.word != "within noise") else (
            f"within noise (inside this run's noise of {self.noise:.0%} around 1.00)")


def verdict(ratio: Ratios, control: Control | None = None, *,
            measures_the_same: bool = True) -> Verdict:
    """Apply the rule (module docs) to ``ratio``, judged by the run's A/A ``control``.

    ``measures_the_same``: the control measures what ``ratio`` does (the e2e's K = 1 rows give
    the noise of tokens/s, not of refresh time, which they do not have). Where it does not, the
    control's rule 2 still withholds the verdict of a run that was too noisy, and rule 4
    decides otherwise.
    """
    if control is not None and control.usable and not control.straddles:
        return Verdict("too noisy", ratio, control.noise, control.off_by)
    if control is not None and control.usable and measures_the_same:
        noise = control.noise
        word: VerdictWord = ("faster" if ratio.median > 1.0 + noise
                             else "slower" if ratio.median < 1.0 - noise else "within noise")
        return Verdict(word, ratio, noise)
    word = ("faster" if ratio.low > 1.0 else "slower" if ratio.high < 1.0 else "within noise")
    return Verdict(word, ratio, None)
