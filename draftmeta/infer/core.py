"""The generic inference API: a build function in, an :class:`Inference` out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from draftmeta.backends.hooks import PagedMqaKernel
from draftmeta.infer.classify import Verdict, classify
from draftmeta.infer.emit import source
from draftmeta.infer.probe import ProbeCase, probe
from draftmeta.rules import Rule
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["Inference", "infer_spec"]


@attrs.frozen
class Inference:
    """An inferred spec: a verdict (rule and evidence) per field.

    Attributes:
        name: the spec's name.
        cls: the metadata class.
        verdicts: one per field or attribute, in the object's order.
        nested: the record class at every nested path.
    """

    name: str
    cls: type
    verdicts: tuple[Verdict, ...]
    nested: dict[str, type]

    @property
    def rules(self) -> dict[str, Rule]:
        """``{path: rule}``, in declaration order."""
        return {v.path: v.rule for v in self.verdicts}

    @property
    def unsettled(self) -> tuple[Verdict, ...]:
        """Fields the evidence did not determine (stubs or ``Unsupported``)."""
        return tuple(v for v in self.verdicts if not v.settled)

    @property
    def attributes(self) -> dict[str, object]:
        """Attributes outside the class's fields, with their annotations."""
        return {v.path: v.annotation for v in self.verdicts if v.attribute}

    def spec(self, rules: dict[str, Rule] | None = None) -> DraftSpec[Any]:
        """The :class:`~draftmeta.spec.DraftSpec` (``rules`` replaces some, for experiments)."""
        merged = {**self.rules, **(rules or {})}
        return DraftSpec(self.cls, merged, name=self.name, nested=self.nested,
                         attributes=self.attributes)

    def source(self, header: str = "") -> str:
        """The spec as Python source, with a comment per field saying what chose its rule."""
        return source(name=self.name, cls=self.cls, verdicts=self.verdicts, nested=self.nested,
                      header=header)


def infer_spec(
    cls: type,
    build: Callable[[DraftState], Any],
    *,
    block_size: int,
    name: str | None = None,
    cases: Sequence[ProbeCase] | None = None,
    compute_units: int | None = None,
    paged_mqa_kernel: PagedMqaKernel | None = None,
) -> Inference:
    """Infer the spec of metadata class ``cls`` from a builder.

    Args:
        cls: the class ``build`` returns.
        build: makes the metadata for a draft state (decode batch, query length 1); it may
            keep views of the state's tensors, as real builders do.
        block_size: the KV block size ``build`` expects.
        name: the spec's name (default ``"<class>.inferred"``).
        cases: probe trajectories (default :func:`~draftmeta.infer.probe.default_cases`).
        compute_units: the CPU's compute units, to recognise AMX's split count.
        paged_mqa_kernel: the engine's paged-MQA schedule kernel, for the DeepGEMM hook a
            ``schedule_metadata`` buffer gets.

    Raises:
        TypeError: ``build`` returned something other than a ``cls``.
    """
    seen = probe(build, block_size=block_size, cases=tuple(cases) if cases else None)
    built = seen[0].steps[0].types[""]
    if built is not cls:
        raise TypeError(f"build returned a {built.__qualname__}, not a {cls.__qualname__}")
    verdicts, types = classify(seen, block_size=block_size, compute_units=compute_units,
                               paged_mqa_kernel=paged_mqa_kernel)
    covered = {v.path for v in verdicts}
    nested = {p: t for p, t in types.items() if p and p not in covered}
    return Inference(name or f"{cls.__qualname__}.inferred", cls, tuple(verdicts), nested)
