"""One generated Triton kernel per draft step for the elementwise rules of every group.

The source advance (positions, sequence lengths, slot mapping, DCP-local lengths) and the
elementwise rules of every capable group's spec (advances, fills, copies) are compiled into
one Triton kernel, so that on CUDA a draft step costs one launch plus any backend recompute
hooks. Values a row computes (an advanced sequence length) stay in registers for the rules that
read them later in the same row; copies of a tensor onto itself (a field that aliases its
source) are dropped. Everything else a spec declares (preconditions, structure checks, host
values, recompute hooks, non-elementwise derivations) still runs through the group's
generated check and finish functions, in the same order as the unfused update: they come from
:func:`~draftmeta.codegen.generate`, as the update does, and :attr:`FusedStep.generated` keeps
them (source, globals, line map).

Like the update functions, the kernel source is generated text (:attr:`FusedStep.source`); it
is written to a cache file so Triton can read it, and imported from there (Triton reads a
kernel's source from its file).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftmeta.advance import HostBound, OverflowPolicy, advance_spec
from draftmeta.codegen import GeneratedUpdate, UpdateFunction, generate
from draftmeta.refs import is_state_ref
from draftmeta.rules import Rule
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["FusedStep", "fusable_paths", "fused_source", "triton_available"]

BLOCK = 128


def triton_available() -> bool:
    """Whether Triton is installed and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("triton") is not None


def fusable_paths(spec: DraftSpec[Any]) -> frozenset[str]:
    """The paths of ``spec`` whose rules the fused kernel can apply.

    Every rule that says it is :attr:`~draftmeta.rules.Rule.fusable` (advances; derivations
    whose formula has a Triton form: slot mapping, DCP-local lengths, fills, copies), except a
    rule that reads a field written this step by a rule that is not fused (a recompute hook, a
    host value): the kernel runs before those, so it would read a stale value; such a rule
    stays in the group's generated finish function.
    """
    out: set[str] = set()
    unfused_writes: set[str] = set()
    for path, rule in spec.rules.items():
        reads_unfused = any(
            r == w or r.startswith(w + ".") or w.startswith(r + ".")
            for r in rule.reads()
            for w in unfused_writes
            if not is_state_ref(r)
        )
        if rule.fusable and not reads_unfused:
            out.add(path)
        elif rule.writes:
            unfused_writes.add(path)
    return frozenset(out)


def _resolve(obj: Any, state: DraftState, ref: str) -> Any:
    if is_state_ref(ref):
        return getattr(state, ref[len("state."):])
    for part in ref.split("."):
        obj = getattr(obj, part)
    return obj


def _identifier(text: str) -> str:
    name = re.sub(r"\W+", "_", text).strip("_") or "arg"
    return f"_{name}" if name[0].isdigit() else name


class _Kernel:
    """Builds the kernel's source: tensor arguments, scalar arguments and the body.

    Arguments are named after what they hold: a tensor after the field it is first met as
    (``seq_lens``, ``indexer_decode_decode_lens``), a state scalar after the state field
    (``num_reqs``, ``max_model_len_minus_1``), a size or stride after its role (``rows``,
    ``stride``); a second, different value of the same role gets a suffix (``rows_2``).
    """

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.tensor_names: dict[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
        self.scalars: list[tuple[str, Callable[[DraftState], int]]] = []
        self.consts: dict[tuple[str, int], str] = {}
        self.taken: set[str] = {"offs", "BLOCK", "c", "cs", "mm", "val", "tl", "triton"}
        self.body: list[str] = []
        self.registers: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
        self.rows = 1
        self.count = 0

    def _name(self, hint: str) -> str:
        base = _identifier(hint)
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def _key(self, t: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]:
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def ptr(self, t: torch.Tensor, hint: str) -> str:
        key = self._key(t)
        if key not in self.tensor_names:
            self.tensor_names[key] = self._name(hint)
            self.tensors.append(t)
        return self.tensor_names[key]

    def scalar(self, hint: str, fn: Callable[[DraftState], int]) -> str:
        """A per-launch value read from the state; one argument per distinct ``hint`` (the
        hint names what ``fn`` reads, so equal hints read equal values)."""
        for name, _ in self.scalars:
            if name == _identifier(hint):
                return name
        name = self._name(hint)
        self.scalars.append((name, fn))
        return name

    def const(self, role: str, value: int) -> str:
        """A size or stride, passed as an argument so one compiled kernel serves every batch
        shape (Triton specialises only on divisibility); equal values of one role share an
        argument."""
        if (role, value) not in self.consts:
            name = self._name(role)
            self.scalars.append((name, lambda _: value))
            self.consts[(role, value)] = name
        return self.consts[(role, value)]

    def var(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def emit(self, line: str) -> None:
        self.body.append("    " + line)

    def mask(self, n: int) -> str:
        self.rows = max(self.rows, n)
        return f"offs < {self.const('rows', n)}"

    def load1d(self, t: torch.Tensor, hint: str) -> str:
        """A register holding the row values of a 1-D (or flattened contiguous) tensor."""
        flat = t.view(-1) if t.is_contiguous() else t
        key = (flat.data_ptr(), tuple(flat.shape), flat.dtype)
        if key in self.registers:
            return self.registers[key]
        v = self.var()
        self.emit(f"{v} = tl.load({self.ptr(flat, hint)} + offs * "
                  f"{self.const('stride', flat.stride(0))}, mask={self.mask(flat.shape[0])}, "
                  "other=0)")
        self.registers[key] = v
        return v

    def store1d(self, t: torch.Tensor, value: str, hint: str) -> None:
        flat = t.view(-1) if t.is_contiguous() else t
        v = self.var()
        self.emit(f"{v} = {value}")
        self.emit(f"tl.store({self.ptr(flat, hint)} + offs * "
                  f"{self.const('stride', flat.stride(0))}, {v}, mask={self.mask(flat.shape[0])})")
        self.registers[(flat.data_ptr(), tuple(flat.shape), flat.dtype)] = v

    def source(self, name: str) -> str:
        args = [name for name in self.tensor_names.values()] + [n for n, _ in self.scalars]
        head = [
            "import triton",
            "import triton.language as tl",
            "",
            "",
            "@triton.jit",
            f"def {name}({', '.join(args)}, BLOCK: tl.constexpr):",
            "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        ]
        return "\n".join(head + self.body) + "\n"


def _emit_rule(
    k: _Kernel, rule: Rule, out: torch.Tensor, inputs: list[Any], label: str, names: list[str]
) -> None:
    """Emit ``rule``'s lines, after a comment naming it; ``names[0]`` names ``out``,
    ``names[1:]`` the inputs."""
    k.emit("# " + repr(f"{label}: {rule.describe()}")[1:-1])  # user text: one escaped line
    rule.lower_triton(k, out, inputs, names)


def _arg_name(spec: DraftSpec[Any], state_part: bool, ref: str) -> str:
    """The kernel argument name of a field: the state's fields by their own name, a group's
    fields prefixed with the spec's first name part (``indexer_decode_seq_lens``)."""
    if is_state_ref(ref):
        return ref[len("state."):]
    if state_part:
        return ref
    return f"{spec.name.split('.')[0].lower()}_{ref}"


def _parts(
    state: DraftState,
    groups: Sequence[tuple[DraftSpec[Any], Any]],
    policy: OverflowPolicy,
    host_bound: HostBound,
) -> list[tuple[DraftSpec[Any], Any]]:
    advance = advance_spec(policy, host_bound, state.dcp_world_size > 1)
    return [(advance, state), *groups]


def _build_kernel(state: DraftState, parts: Sequence[tuple[DraftSpec[Any], Any]]) -> _Kernel:
    kernel = _Kernel()
    for spec, metadata in parts:
        fused = fusable_paths(spec)
        state_part = metadata is state
        for path, rule in spec.rules.items():
            if path not in fused:
                continue
            out = _resolve(metadata, state, path)
            inputs = [_resolve(metadata, state, r) for r in rule.reads()]
            names = [_arg_name(spec, state_part, r) for r in (path, *rule.reads())]
            _emit_rule(kernel, rule, out, inputs, f"{spec.name}: {path}", names)
    return kernel


def _kernel_name(kernel: _Kernel) -> str:
    digest = hashlib.sha1("\n".join(kernel.body).encode()).hexdigest()[:12]
    return f"draftmeta_fused_step_{digest}"


def fused_source(
    state: DraftState,
    groups: Sequence[tuple[DraftSpec[Any], Any]],
    *,
    policy: OverflowPolicy = "clamp",
    host_bound: HostBound = "advance",
) -> str:
    """The Triton source :class:`FusedStep` would compile for these arguments, generated
    without compiling or launching it: the buffers may live on the CPU and Triton need not be
    installed. The text holds no addresses: sizes and strides are kernel arguments named after
    their role, one per distinct value (``rows``, ``rows_2``), so shapes change the text only
    where they make such values coincide or differ, and through a 2-D copy's width and strides
    (literals); for fixed shapes it can be checked in.
    """
    kernel = _build_kernel(state, _parts(state, groups, policy, host_bound))
    return kernel.source(_kernel_name(kernel))


class FusedStep:
    """The fused per-step kernel for one state and a set of groups' metadata.

    Args:
        state: the draft state (its buffers are the kernel's arguments).
        groups: ``(spec, metadata)`` of every group that updates in place.
        policy: the source advance's overflow policy.
        host_bound: how the host ``max_seq_len`` moves.

    The kernel is bound to the buffers' addresses at construction: build a new ``FusedStep``
    when a group's metadata or the state's buffers are replaced.
    """

    def __init__(
        self,
        state: DraftState,
        groups: Sequence[tuple[DraftSpec[Any], Any]],
        *,
        policy: OverflowPolicy = "clamp",
        host_bound: HostBound = "advance",
    ) -> None:
        self.state = state
        self._parts = _parts(state, groups, policy, host_bound)
        self.generated: list[tuple[GeneratedUpdate, GeneratedUpdate]] = [
            (generate(spec, "check"), generate(spec, "finish", fusable_paths(spec)))
            for spec, _ in self._parts
        ]
        """The generated check and finish functions of every part (the source advance first),
        before they were compiled: what runs around the kernel, as :func:`explain
        <draftmeta.codegen.explain>` shows the update."""
        self.checks: list[UpdateFunction[Any]] = [c.compile() for c, _ in self.generated]
        self.finishes: list[UpdateFunction[Any]] = [f.compile() for _, f in self.generated]
        kernel = _build_kernel(state, self._parts)
        self.name = _kernel_name(kernel)
        self.source: str = kernel.source(self.name)
        self._kernel = _load(self.name, self.source)
        self._tensors = kernel.tensors
        self._scalars = kernel.scalars
        self._grid = ((kernel.rows + BLOCK - 1) // BLOCK,)

    def check(self) -> None:
        """Run every part's preconditions and structure checks (raise before any write)."""
        for (_, metadata), check in zip(self._parts, self.checks):
            check(metadata, self.state)

    def launch(self) -> None:
        """Launch the fused kernel once (all elementwise writes of the step)."""
        scalars = [fn(self.state) for _, fn in self._scalars]
        self._kernel[self._grid](*self._tensors, *scalars, BLOCK=BLOCK)

    def finish(self) -> None:
        """Host values, recompute hooks and other non-fused writes, part by part."""
        for (_, metadata), finish in zip(self._parts, self.finishes):
            finish(metadata, self.state)

    def __call__(self) -> None:
        """One whole step: checks, the kernel, then the rest."""
        self.check()
        self.launch()
        self.finish()


def _cache_dir() -> Path:
    root = os.environ.get("DRAFTMETA_CACHE") or os.path.join(tempfile.gettempdir(), "draftmeta")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load(name: str, source: str) -> Any:
    path = _cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
