"""One generated Triton kernel per draft step for the elementwise rules of every group.

The source advance (positions, sequence lengths, slot mapping, DCP-local lengths) and the
elementwise rules of every capable group's spec (advances, fills, copies) are compiled into
one Triton kernel, so that on CUDA a draft step costs one launch plus any backend recompute
hooks. Values a row computes (an advanced sequence length) stay in registers for the rules that
read them later in the same row; copies of a tensor onto itself (a field that aliases its
source) are dropped. Everything else a spec declares (preconditions, structure checks, host
values, recompute hooks, non-elementwise derivations) still runs through the group's
generated check and finish functions, in the same order as the unfused update.

Like the update functions, the kernel source is generated text (:attr:`FusedStep.source`); it
is written to a cache file so Triton can read it, and imported from there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftmeta.advance import HostBound, OverflowPolicy, advance_spec
from draftmeta.codegen import UpdateFunction, compile_spec
from draftmeta.derivations import CopyFrom, DcpLocalSeqLens, Fill, SlotMapping
from draftmeta.rules import Advance, Clamp, Derive, Wrap
from draftmeta.spec import DraftSpec, is_state_ref
from draftmeta.state import DraftState

__all__ = ["FusedStep", "fusable_paths", "triton_available"]

BLOCK = 128


def triton_available() -> bool:
    """Whether Triton is installed and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("triton") is not None


def fusable_paths(spec: DraftSpec[Any]) -> frozenset[str]:
    """The paths of ``spec`` whose rules the fused kernel can apply.

    Advances and elementwise derivations (slot mapping, DCP-local lengths, fills, copies),
    except a rule that reads a field written this step by a rule that is not fused (a
    recompute hook, a host value): the kernel runs before those, so it would read a stale
    value; such a rule stays in the group's generated finish function.
    """
    out: set[str] = set()
    unfused_writes: set[str] = set()
    for path, rule in spec.rules.items():
        elementwise = isinstance(rule, Advance) or (
            isinstance(rule, Derive)
            and isinstance(rule.derivation, (SlotMapping, DcpLocalSeqLens, Fill, CopyFrom))
        )
        reads_unfused = any(
            r == w or r.startswith(w + ".") or w.startswith(r + ".")
            for r in rule.reads()
            for w in unfused_writes
            if not is_state_ref(r)
        )
        if elementwise and not reads_unfused:
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


class _Kernel:
    """Builds the kernel's source: tensor arguments, scalar arguments and the body."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.tensor_names: dict[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
        self.scalars: list[tuple[str, Callable[[DraftState], int]]] = []
        self.consts: dict[int, str] = {}
        self.body: list[str] = []
        self.registers: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
        self.rows = 1
        self.count = 0

    def _key(self, t: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]:
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def ptr(self, t: torch.Tensor) -> str:
        key = self._key(t)
        if key not in self.tensor_names:
            self.tensor_names[key] = f"t{len(self.tensors)}"
            self.tensors.append(t)
        return self.tensor_names[key]

    def scalar(self, fn: Callable[[DraftState], int]) -> str:
        name = f"s{len(self.scalars)}"
        self.scalars.append((name, fn))
        return name

    def const(self, value: int) -> str:
        """A size or stride, passed as an argument so one compiled kernel serves every batch
        shape (Triton specialises only on divisibility); equal values share an argument."""
        if value not in self.consts:
            self.consts[value] = self.scalar(lambda _: value)
        return self.consts[value]

    def var(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def emit(self, line: str) -> None:
        self.body.append("    " + line)

    def mask(self, n: int) -> str:
        self.rows = max(self.rows, n)
        return f"offs < {self.const(n)}"

    def load1d(self, t: torch.Tensor) -> str:
        """A register holding the row values of a 1-D (or flattened contiguous) tensor."""
        flat = t.view(-1) if t.is_contiguous() else t
        key = (flat.data_ptr(), tuple(flat.shape), flat.dtype)
        if key in self.registers:
            return self.registers[key]
        v = self.var()
        self.emit(f"{v} = tl.load({self.ptr(flat)} + offs * {self.const(flat.stride(0))}, "
                  f"mask={self.mask(flat.shape[0])}, other=0)")
        self.registers[key] = v
        return v

    def store1d(self, t: torch.Tensor, value: str) -> None:
        flat = t.view(-1) if t.is_contiguous() else t
        v = self.var()
        self.emit(f"{v} = {value}")
        self.emit(f"tl.store({self.ptr(flat)} + offs * {self.const(flat.stride(0))}, {v}, "
                  f"mask={self.mask(flat.shape[0])})")
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


def _same_flat(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.is_contiguous()
        and b.is_contiguous() and a.numel() <= b.numel()
    )


def _emit_rule(k: _Kernel, rule: Any, out: torch.Tensor, inputs: list[Any], path: str) -> None:
    k.emit("# " + repr(f"{path}: {rule.describe()}")[1:-1])  # user text: one escaped line
    if isinstance(rule, Advance):
        x = k.load1d(out)
        o = rule.overflow
        if isinstance(o, Clamp):
            bound, offset = o.bound, o.offset
            limit = k.scalar(lambda s: int(getattr(s, bound)) + offset)
            value = f"tl.minimum({x} + {rule.by}, {limit})"
        else:
            assert isinstance(o, Wrap)
            bound, offset, restart = o.bound, o.offset, o.restart
            span = k.scalar(lambda s: int(getattr(s, bound)) + offset - restart + 1)
            value = f"({x} + {rule.by - restart}) % {span} + {restart}"
        if rule.rows:  # padded rows keep their values
            rows_name = rule.rows
            real = k.scalar(lambda s: int(getattr(s, rows_name)))
            value = f"tl.where(offs < {real}, {value}, {x})"
        k.store1d(out, value)
        return
    d = rule.derivation
    if isinstance(d, Fill):
        k.store1d(out, f"tl.full([BLOCK], {d.value}, tl.int32)")
    elif isinstance(d, CopyFrom):
        src = inputs[0]
        assert isinstance(src, torch.Tensor)
        if d.flat or out.dim() == 1:
            if _same_flat(out, src):
                k.emit("# (copy onto itself: nothing to do)")
                return
            k.store1d(out, k.load1d(src))
        else:
            if out.data_ptr() == src.data_ptr() and out.stride() == src.stride():
                k.emit("# (copy onto itself: nothing to do)")
                return
            rows, cols = out.shape[0], out.shape[1]
            m = k.mask(rows)
            k.emit(f"for c in range(0, {cols}, 32):")
            k.emit("    cs = c + tl.arange(0, 32)")
            k.emit(f"    mm = ({m})[:, None] & (cs < {cols})[None, :]")
            k.emit(f"    val = tl.load({k.ptr(src)} + offs[:, None] * {src.stride(0)} + "
                   f"cs[None, :] * {src.stride(1)}, mask=mm)")
            k.emit(f"    tl.store({k.ptr(out)} + offs[:, None] * {out.stride(0)} + "
                   f"cs[None, :] * {out.stride(1)}, val, mask=mm)")
    elif isinstance(d, SlotMapping):
        positions, table, seq_lens = inputs[0], inputs[1], inputs[2]
        pos, seq = k.load1d(positions), k.load1d(seq_lens)
        bs = k.scalar(lambda s: s.block_size)
        reqs = k.scalar(lambda s: s.num_reqs)
        blk, slot = k.var(), k.var()
        last = k.const(table.shape[1] - 1)
        row, col = k.const(table.stride(0)), k.const(table.stride(1))
        k.emit(f"{blk} = tl.load({k.ptr(table)} + offs * {row} + "
               f"tl.minimum({pos} // {bs}, {last}) * {col}, "
               f"mask={k.mask(out.shape[0])}, other=0)")
        k.emit(f"{slot} = {blk}.to(tl.int64) * {bs} + {pos} % {bs}")
        k.store1d(out, f"tl.where((offs < {reqs}) & ({seq} > 1), {slot}, -1)")
    elif isinstance(d, DcpLocalSeqLens):
        seq = k.load1d(inputs[0])
        world = k.scalar(lambda s: s.dcp_world_size)
        rank = k.scalar(lambda s: s.dcp_rank)
        inter = k.scalar(lambda s: s.dcp_interleave)
        base, rest = k.var(), k.var()
        k.emit(f"{base} = {seq} // ({inter} * {world}) * {inter}")
        k.emit(f"{rest} = tl.minimum(tl.maximum({seq} - {base} * {world} - {rank} * {inter}, 0), "
               f"{inter})")
        k.store1d(out, f"{base} + {rest}")
    else:  # pragma: no cover - fusable_paths admits only the kinds above
        raise TypeError(f"cannot fuse {d!r}")


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
        advance = advance_spec(policy, host_bound, state.dcp_world_size > 1)
        self._parts: list[tuple[DraftSpec[Any], Any]] = [(advance, state), *groups]
        kernel = _Kernel()
        self.checks: list[UpdateFunction[Any]] = []
        self.finishes: list[UpdateFunction[Any]] = []
        for spec, metadata in self._parts:
            fused = fusable_paths(spec)
            self.checks.append(compile_spec(spec, "check"))
            self.finishes.append(compile_spec(spec, "finish", fused))
            for path, rule in spec.rules.items():
                if path not in fused:
                    continue
                out = _resolve(metadata, state, path)
                inputs = [_resolve(metadata, state, r) for r in rule.reads()]
                _emit_rule(kernel, rule, out, inputs, f"{spec.name}: {path}")
        digest = hashlib.sha1("\n".join(kernel.body).encode()).hexdigest()[:12]
        self.name = f"draftmeta_fused_step_{digest}"
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
