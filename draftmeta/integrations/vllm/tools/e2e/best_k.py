"""The best K: expected throughput per K from measured step times and an acceptance model.

A step of a speculative engine verifies the K draft tokens of each request and generates, per
request, one token plus the accepted drafts. With every draft token accepted independently with
probability ``alpha`` (the usual model, e.g. Leviathan et al. 2023) and drafts cut at the first
rejection, a step yields on average

    E(K, alpha) = 1 + alpha + alpha^2 + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)

tokens per request. A step's wall time T(K) barely depends on how many drafts were accepted (it
verifies K + 1 tokens and drafts K either way), so a run with random weights, where almost
nothing is accepted, measures it as well as a trained model would. The expected tok/s of a
batch of ``b`` requests is then ``b * E(K, alpha) / T(K)``: :func:`best_k` finds the K that
maximises it, with the plugin off and on, from the step times of one model, backend and batch
size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["ALPHAS", "BestK", "best_k", "best_k_table", "expected_tokens_per_step",
           "step_times"]

ALPHAS = (0.6, 0.7, 0.8, 0.9)
"""The per-token acceptance rates the report evaluates the best K at."""


def expected_tokens_per_step(k: int, alpha: float) -> float:
    """Tokens one request gains per step with ``k`` drafts, each accepted with probability
    ``alpha`` until the first rejection.

    Raises:
        ValueError: ``k`` < 0 or ``alpha`` outside [0, 1].
    """
    if k < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need k >= 0 and 0 <= alpha <= 1, got k={k}, alpha={alpha}")
    return float(sum(alpha ** i for i in range(k + 1)))


@attrs.frozen
class BestK:
    """The best K at one acceptance rate, plugin off and on.

    Attributes:
        alpha: the per-token acceptance rate assumed.
        k_off: the K with the highest expected tok/s with the plugin off.
        tokens_per_s_off: that expected tok/s.
        k_on: likewise with the plugin on.
        tokens_per_s_on: and its expected tok/s.
    """

    alpha: float
    k_off: int
    tokens_per_s_off: float
    k_on: int
    tokens_per_s_on: float

    @property
    def gain(self) -> float:
        """The best K's expected tok/s with the plugin over the best K's without."""
        return self.tokens_per_s_on / self.tokens_per_s_off


def best_k(step_ms: Mapping[int, tuple[float, float]], batch_size: int,
           alphas: Sequence[float] = ALPHAS) -> list[BestK]:
    """For each ``alpha``, the K of ``step_ms`` (K -> (off, on) wall time per step, ms) with
    the highest expected tok/s, off and on.

    Raises:
        ValueError: no step times, or a step time that is not positive.
    """
    if not step_ms:
        raise ValueError("need the step time of at least one K")
    if any(t <= 0 for pair in step_ms.values() for t in pair):
        raise ValueError(f"step times must be positive, got {dict(step_ms)}")

    def rate(k: int, alpha: float, side: int) -> float:
        return batch_size * expected_tokens_per_step(k, alpha) / step_ms[k][side] * 1e3

    out = []
    for alpha in alphas:
        k_off = max(step_ms, key=lambda k: rate(k, alpha, 0))
        k_on = max(step_ms, key=lambda k: rate(k, alpha, 1))
        out.append(BestK(alpha, k_off, rate(k_off, alpha, 0), k_on, rate(k_on, alpha, 1)))
    return out


def step_times(configurations: Sequence[Mapping[str, Any]]
               ) -> dict[tuple[str, str, int], dict[int, tuple[float, float]]]:
    """From a run's configurations (:func:`~draftmeta.integrations.vllm.tools.e2e.report.summary`),
    the step times by (model, backend, batch size) and K: the plugin's timed cases with a step
    time on both sides (no A/A control, no eager engines, no replaced upstream hook, no FP8
    cache)."""
    out: dict[tuple[str, str, int], dict[int, tuple[float, float]]] = {}
    for e in configurations:
        step = e.get("step_ms") or {}
        if (e.get("aa") or e.get("control") or e.get("eager")
                or e["override_upstream"] or e["kv_cache_dtype"] != "auto"
                or step.get("off") is None or step.get("on") is None):
            continue
        key = (e["model"], e["backend"], e["batch_size"])
        out.setdefault(key, {})[e["k"]] = (step["off"], step["on"])
    return out


def best_k_table(configurations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per model, backend and batch size measured at two or more K: the best K and its
    expected tok/s, plugin off and on, at each acceptance rate of :data:`ALPHAS`
    (:func:`best_k` from the measured step times)."""
    rows = []
    for (model, backend, batch), times in step_times(configurations).items():
        if len(times) < 2:
            continue
        for b in best_k(times, batch):
            rows.append({"model": model, "backend": backend, "batch_size": batch,
                         "ks": sorted(times), "alpha": b.alpha, "k_off": b.k_off,
                         "tokens_per_s_off": round(b.tokens_per_s_off, 1), "k_on": b.k_on,
                         "tokens_per_s_on": round(b.tokens_per_s_on, 1),
                         "gain": round(b.gain, 3)})
    return rows
