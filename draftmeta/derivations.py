"""Formulas for derived fields and hooks for recomputed ones.

A :class:`Derivation` recomputes a tensor field from other fields every draft step (slot mapping
from positions and the block table, DCP-local sequence lengths from global ones, a token-to-
request map, ...). A :class:`RecomputeHook` refills a persistent buffer with a backend kernel
(a scheduler's metadata). Both work strictly in place: ``check`` validates shapes, dtypes and
devices before the update writes anything, and ``apply`` writes with ``out=`` ops and workspace
buffers only, so the steady state allocates nothing and never waits on the device.

A derivation opts into the fused Triton kernel (:mod:`draftmeta.fused`) by overriding
:meth:`Derivation.emit_triton`: it then writes its own lines of the kernel through a
:class:`TritonKernel`, and :attr:`Derivation.fusable` becomes true. No other module lists it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

import attrs
import torch

from draftmeta.workspace import Workspace

if TYPE_CHECKING:
    from draftmeta.state import DraftState

__all__ = [
    "argument_problem",
    "CopyFrom",
    "DcpLocalSeqLens",
    "Derivation",
    "ExpandBlockTable",
    "Fill",
    "InPlaceFunction",
    "RecomputeHook",
    "SlotMapping",
    "TokenToRequest",
    "TritonKernel",
]

Argument = Literal["tensor", "int", "any"]
"""The kind of one input a formula takes: a tensor, a host int, or anything."""


class InPlaceFunction(abc.ABC):
    """Something that writes one tensor in place from inputs: the common base of the two kinds.

    Attributes:
        name: a short identifier, used in the generated source.
        formula: a human-readable statement of what is computed.
        arguments: the kind of each input, in order (``("tensor", "int")``), checked against
            the rule's inputs when the spec is declared; ``None`` (the default for formulas
            defined elsewhere) checks only at run time.
    """

    name: ClassVar[str]
    formula: ClassVar[str]
    arguments: ClassVar[tuple[Argument, ...] | None] = None
    checks_layout_only: ClassVar[bool] = False
    """Whether :meth:`check` reads nothing of its tensor arguments but their kind, shape,
    strides, dtype and device: a sealed step whose arguments are all tensors the seal checked
    (the same objects, or state buffers over the same memory and layout) then skips it, since
    it would return what it returned at the seal. Leave it ``False`` for a check that reads
    anything else (a tensor's values, a backend's state)."""

    def is_noop(self, out: torch.Tensor, *inputs: object) -> bool:
        """Whether ``apply`` would write nothing because ``out`` is already its result (a copy
        onto itself). Such a field may share storage with its input; any other written field
        may not share storage with what it reads or with the draft state."""
        return False

    @abc.abstractmethod
    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        """Return ``None`` if ``apply`` can run on these arguments, else what is wrong.

        Runs before the update writes anything; must not write and must not sync.
        """

    @abc.abstractmethod
    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        """Write the result into ``out`` in place (allocation-free in steady state)."""


class TritonKernel(Protocol):
    """The fused Triton kernel being generated, as a rule or derivation writing into it sees it.

    The kernel runs one program per ``BLOCK`` rows; ``offs`` (the row indices) and ``BLOCK``
    are in scope. Arguments are made on demand and named after what they hold: a tensor by
    :meth:`ptr`, a per-launch value read from the draft state by :meth:`scalar`, a size or
    stride by :meth:`const`.
    """

    def emit(self, line: str) -> None:
        """Write one line of the kernel body (``"    "`` nests it in a loop written before)."""

    def var(self) -> str:
        """A fresh register name."""

    def ptr(self, t: torch.Tensor, hint: str) -> str:
        """The argument holding ``t``'s address, named after ``hint`` on first use."""

    def scalar(self, hint: str, fn: Callable[[DraftState], int]) -> str:
        """A per-launch int argument computed by ``fn`` from the draft state; equal hints
        name equal values and share one argument."""

    def const(self, role: str, value: int) -> str:
        """A size or stride argument of the given role; equal values share one argument."""

    def mask(self, n: int) -> str:
        """The mask of the first ``n`` rows (the launch covers at least ``n`` rows)."""

    def load1d(self, t: torch.Tensor, hint: str) -> str:
        """A register holding the row values of a 1-D (or flattened contiguous) tensor;
        a value stored earlier in the kernel is reused, not reloaded."""

    def store1d(self, t: torch.Tensor, value: str, hint: str) -> None:
        """Store the expression ``value`` into the rows of a 1-D (or flattened) tensor."""


class Derivation(InPlaceFunction):
    """An elementwise formula computing a tensor field from other fields.

    A formula that overrides :meth:`emit_triton` is :attr:`fusable`: the fused kernel applies
    it instead of :meth:`~InPlaceFunction.apply`, and must compute the same values.
    """

    @property
    def fusable(self) -> bool:
        """Whether the fused Triton kernel can apply the formula (it overrides
        :meth:`emit_triton`)."""
        return type(self).emit_triton is not Derivation.emit_triton

    def emit_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        """Write the formula into the fused kernel: compute the rows of ``out`` from
        ``inputs`` (the values of the rule's inputs, tensors and host ints); ``names[0]``
        names ``out``'s argument, ``names[1:]`` the inputs'. Most formulas end with
        ``kernel.store1d(out, expression, names[0])``. Not overridden: not fusable."""
        raise NotImplementedError(f"{type(self).__qualname__} has no Triton form")


class RecomputeHook(InPlaceFunction):
    """A backend kernel that refills a persistent buffer of fixed shape.

    A hook whose kernel has several outputs receives the other output tensors (the fields its
    :class:`~draftmeta.rules.Recompute` rule lists in ``also``) as the keyword ``also``.

    Attributes:
        capture_safe: whether the hook may run inside a CUDA graph (no device-to-host reads,
            no pageable copies, results written in place).
    """

    capture_safe: ClassVar[bool] = True

    @abc.abstractmethod
    def check(
        self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
    ) -> str | None:
        """Return ``None`` if ``apply`` can run on these arguments, else what is wrong."""

    @abc.abstractmethod
    def apply(
        self,
        out: torch.Tensor,
        *inputs: object,
        workspace: Workspace,
        also: tuple[torch.Tensor, ...] = (),
    ) -> None:
        """Refill ``out`` (and the ``also`` outputs) in place."""


def _tensor(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a tensor input, got {type(x).__qualname__}")
    return x


def _int(x: object) -> int:
    if type(x) is not int:
        raise TypeError(f"expected a host int input, got {x!r} ({type(x).__qualname__})")
    return x


def argument_problem(inputs: tuple[object, ...], kinds: tuple[Argument, ...]) -> str | None:
    """What is wrong with the number or kinds of ``inputs``, or ``None``."""
    if len(inputs) != len(kinds):
        return f"takes {len(kinds)} input(s), got {len(inputs)}"
    for i, (value, kind) in enumerate(zip(inputs, kinds)):
        if kind == "tensor" and not isinstance(value, torch.Tensor):
            return f"input {i} must be a tensor, got {type(value).__qualname__}"
        if kind == "int" and type(value) is not int:
            return f"input {i} must be a host int, got {value!r} ({type(value).__qualname__})"
    return None


def _not_int(name: str, t: torch.Tensor) -> str | None:
    if t.is_floating_point() or t.is_complex() or t.dtype is torch.bool:
        return f"{name} must be an integer tensor, got {t.dtype}"
    return None


def _same_device(out: torch.Tensor, *tensors: torch.Tensor) -> str | None:
    for t in tensors:
        if t.device != out.device:
            return f"input on {t.device} but output on {out.device}"
    return None


_INT_DTYPES = (torch.int32, torch.int64)


def _broadcasts(src: tuple[int, ...], out: tuple[int, ...]) -> bool:
    if len(src) > len(out):
        return False
    return all(s in (1, o) for s, o in zip(reversed(src), reversed(out)))


@attrs.frozen
class SlotMapping(Derivation):
    """``slot = block_table[r, min(pos // bs, W - 1)] * bs + pos % bs``, padded rows -1.

    Inputs: positions ``[B]``, block_table ``[>=B, W]``, seq_lens ``[B]``, block_size, num_reqs.
    A row is padded (slot -1) when ``r >= num_reqs`` or ``seq_len <= 1``: a decode token has at
    least one token of context, so ``seq_len <= 1`` marks a row whose position wrapped past
    ``max_model_len`` under the wrap policy.
    """

    name: ClassVar[str] = "slot_mapping"
    formula: ClassVar[str] = (
        "block_table[r, min(pos // block_size, W - 1)] * block_size + pos % block_size; "
        "-1 where r >= num_reqs or seq_len <= 1"
    )
    arguments: ClassVar[tuple[Argument, ...]] = ("tensor", "tensor", "tensor", "int", "int")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        problem = argument_problem(inputs, self.arguments)
        if problem is not None:
            return problem
        positions, block_table, seq_lens = map(_tensor, inputs[:3])
        block_size, num_reqs = _int(inputs[3]), _int(inputs[4])
        n = out.shape[0]
        if block_size < 1 or not 0 <= num_reqs <= n:
            return f"block_size {block_size} must be >= 1 and num_reqs {num_reqs} in 0..{n}"
        if out.dim() != 1 or positions.shape != out.shape or seq_lens.shape != out.shape:
            return (
                f"shapes differ: out {tuple(out.shape)}, positions {tuple(positions.shape)}, "
                f"seq_lens {tuple(seq_lens.shape)}"
            )
        if block_table.dim() != 2 or block_table.shape[0] < n:
            return f"block_table has shape {tuple(block_table.shape)}, needs [>= {n}, W]"
        if out.dtype not in _INT_DTYPES or positions.dtype not in _INT_DTYPES:
            return (
                "slot mapping and positions must be int32/int64, got "
                f"{out.dtype}, {positions.dtype}"
            )
        problem = _not_int("block_table", block_table) or _not_int("seq_lens", seq_lens)
        if problem is not None:
            return problem
        if block_table.shape[1] < 1:
            return "block_table has no columns"
        return _same_device(out, positions, block_table, seq_lens)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        positions, block_table, seq_lens = map(_tensor, inputs[:3])
        block_size, num_reqs = _int(inputs[3]), _int(inputs[4])
        n, width = out.shape[0], block_table.shape[1]
        dev = out.device
        index = workspace.buffer("slot_mapping.index", (n, 1), torch.int64, dev)
        block = workspace.buffer("slot_mapping.block", (n, 1), block_table.dtype, dev)
        valid = workspace.buffer("slot_mapping.valid", (n,), torch.bool, dev)
        torch.div(positions.unsqueeze(1), block_size, rounding_mode="floor", out=index)
        index.clamp_(max=width - 1)
        table = block_table[:n] if block_table.shape[0] != n else block_table
        torch.gather(table, 1, index, out=block)
        torch.remainder(positions, block_size, out=out)
        out.add_(block.view(n), alpha=block_size)
        torch.gt(seq_lens, 1, out=valid)
        if num_reqs < n:
            valid[num_reqs:].fill_(False)
        out.add_(1).mul_(valid).sub_(1)

    def emit_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        k = kernel
        positions, table, seq_lens = map(_tensor, inputs[:3])
        pos, seq = k.load1d(positions, names[1]), k.load1d(seq_lens, names[3])
        bs = k.scalar("block_size", lambda s: s.block_size)
        reqs = k.scalar("num_reqs", lambda s: s.num_reqs)
        blk, slot = k.var(), k.var()
        last = k.const("last_block", table.shape[1] - 1)
        row, col = k.const("row_stride", table.stride(0)), k.const("stride", table.stride(1))
        k.emit(f"{blk} = tl.load({k.ptr(table, names[2])} + offs * {row} + "
               f"tl.minimum({pos} // {bs}, {last}) * {col}, "
               f"mask={k.mask(out.shape[0])}, other=0)")
        k.emit(f"{slot} = {blk}.to(tl.int64) * {bs} + {pos} % {bs}")
        k.store1d(out, f"tl.where((offs < {reqs}) & ({seq} > 1), {slot}, -1)", names[0])


@attrs.frozen
class DcpLocalSeqLens(Derivation):
    """The share of each sequence held by one decode-context-parallel rank.

    Tokens are dealt to ``N = dcp_world_size`` ranks round-robin in groups of
    ``I = interleave``: ``local = seq // (I*N) * I + clamp(seq - seq // (I*N) * I * N - rank*I,
    0, I)``. Recomputed from the global lengths every step, never incremented.

    Inputs: seq_lens ``[B]``, dcp_world_size, dcp_rank, interleave.
    """

    name: ClassVar[str] = "dcp_local_seq_lens"
    formula: ClassVar[str] = (
        "seq // (I*N) * I + clamp(seq - seq // (I*N) * I * N - rank*I, 0, I) "
        "with N = dcp_world_size, I = interleave"
    )

    arguments: ClassVar[tuple[Argument, ...]] = ("tensor", "int", "int", "int")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        problem = argument_problem(inputs, self.arguments)
        if problem is not None:
            return problem
        seq_lens = _tensor(inputs[0])
        if seq_lens.shape != out.shape:
            return f"shapes differ: out {tuple(out.shape)}, seq_lens {tuple(seq_lens.shape)}"
        problem = _not_int("the DCP-local lengths", out) or _not_int("seq_lens", seq_lens)
        if problem is not None:
            return problem
        world, rank, interleave = _int(inputs[1]), _int(inputs[2]), _int(inputs[3])
        if world < 1 or interleave < 1 or not 0 <= rank < world:
            return f"invalid DCP setting: world {world}, rank {rank}, interleave {interleave}"
        return _same_device(out, seq_lens)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        seq_lens = _tensor(inputs[0])
        world, rank, interleave = _int(inputs[1]), _int(inputs[2]), _int(inputs[3])
        rest = workspace.buffer("dcp_local.rest", tuple(out.shape), out.dtype, out.device)
        torch.div(seq_lens, interleave * world, rounding_mode="floor", out=out)
        out.mul_(interleave)  # tokens of each full round held by this rank
        torch.mul(out, -world, out=rest)
        rest.add_(seq_lens).sub_(rank * interleave).clamp_(0, interleave)
        out.add_(rest)

    def emit_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        k = kernel
        seq = k.load1d(_tensor(inputs[0]), names[1])
        world = k.scalar("dcp_world_size", lambda s: s.dcp_world_size)
        rank = k.scalar("dcp_rank", lambda s: s.dcp_rank)
        inter = k.scalar("dcp_interleave", lambda s: s.dcp_interleave)
        base, rest = k.var(), k.var()
        k.emit(f"{base} = {seq} // ({inter} * {world}) * {inter}")
        k.emit(f"{rest} = tl.minimum(tl.maximum({seq} - {base} * {world} - {rank} * {inter}, 0), "
               f"{inter})")
        k.store1d(out, f"{base} + {rest}", names[0])


@attrs.frozen
class TokenToRequest(Derivation):
    """``req[t]`` = the request that token ``t`` belongs to, from ``query_start_loc``.

    Inputs: query_start_loc ``[B+1]``, num_reqs. Tokens at or past the end of the last request
    map to 0, as in vLLM. With query length 1 per request this is ``req[t] = t``.
    """

    name: ClassVar[str] = "token_to_request"
    formula: ClassVar[str] = (
        "searchsorted(query_start_loc[1:num_reqs+1], t, right=True) % num_reqs"
    )

    arguments: ClassVar[tuple[Argument, ...]] = ("tensor", "int")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        problem = argument_problem(inputs, self.arguments)
        if problem is not None:
            return problem
        qsl = _tensor(inputs[0])
        num_reqs = _int(inputs[1])
        if num_reqs < 1:
            return f"num_reqs is {num_reqs}; a token-to-request map needs at least one request"
        if out.dim() != 1 or qsl.dim() != 1 or qsl.shape[0] < num_reqs + 1:
            return f"query_start_loc {tuple(qsl.shape)} does not cover {num_reqs} requests"
        if out.dtype not in _INT_DTYPES or qsl.dtype not in _INT_DTYPES:
            return f"token-to-request map and query_start_loc must be int32/int64, got {out.dtype}"
        if not out.is_contiguous():
            return "token-to-request map must be contiguous (searchsorted writes it whole)"
        return _same_device(out, qsl)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        qsl = _tensor(inputs[0])
        num_reqs = _int(inputs[1])
        tokens = workspace.arange(out.shape[0], qsl.dtype, out.device)
        torch.searchsorted(
            qsl[1 : num_reqs + 1], tokens, right=True, out_int32=out.dtype == torch.int32, out=out
        )
        out.remainder_(num_reqs)  # tokens past the last request: num_reqs -> 0


@attrs.frozen
class Fill(Derivation):
    """Every element takes the constant ``value`` (per-request decode lengths of 1, ...).

    Attributes:
        value: the constant.
    """

    name: ClassVar[str] = "fill"
    arguments: ClassVar[tuple[Argument, ...]] = ()
    checks_layout_only: ClassVar[bool] = True
    value: int = attrs.field(default=0, validator=attrs.validators.instance_of((int, float)))

    @property
    def formula(self) -> str:  # type: ignore[override]
        return f"every element = {self.value}"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return argument_problem(inputs, self.arguments)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        out.fill_(self.value)

    def emit_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        kernel.store1d(out, f"tl.full([BLOCK], {self.value}, tl.int32)", names[0])


@attrs.frozen
class CopyFrom(Derivation):
    """The field is a copy of another tensor (an expanded block table, per-token lengths, ...).

    Inputs: the source tensor. Its leading rows are copied: the source must have at least as
    many rows as the field, and the rest of the shape must broadcast. With ``flat=True`` both
    are viewed as 1-D first (``(B, 1)`` per-token lengths from ``(B,)`` sequence lengths).
    Copying a tensor onto itself (a field that aliases its source) is a no-op.

    Attributes:
        flat: copy the flattened source into the flattened field.
    """

    name: ClassVar[str] = "copy"
    arguments: ClassVar[tuple[Argument, ...]] = ("tensor",)
    checks_layout_only: ClassVar[bool] = True
    flat: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @property
    def formula(self) -> str:  # type: ignore[override]
        return "flattened copy of the input" if self.flat else "copy of the input's leading rows"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
            return argument_problem(inputs, self.arguments)
        src = inputs[0]
        if out.shape == src.shape:  # the common case, one cheap comparison
            return None if out.device == src.device else _same_device(out, src)
        if self.flat:
            if src.numel() < out.numel():
                return f"source has {src.numel()} elements, fewer than the field's {out.numel()}"
            for what, t in (("field", out), ("source", src)):
                if t.dim() > 1 and not t.is_contiguous():
                    return f"a flattened copy needs a contiguous {what}, got strides {t.stride()}"
            return _same_device(out, src)
        if src.dim() != out.dim() or src.shape[0] < out.shape[0] or not _broadcasts(
            tuple(src.shape[1:]), tuple(out.shape[1:])
        ):
            return f"source shape {tuple(src.shape)} does not fit {tuple(out.shape)}"
        return _same_device(out, src)

    def is_noop(self, out: torch.Tensor, *inputs: object) -> bool:
        """Whether the field is a view of its source's leading elements (copy onto itself)."""
        src = inputs[0] if inputs else None
        if not isinstance(src, torch.Tensor) or out.data_ptr() != src.data_ptr():
            return False
        if out.dtype != src.dtype:
            return False
        if self.flat and out.shape != src.shape:
            return out.is_contiguous() and src.is_contiguous()
        return out.stride() == src.stride()

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        src = _tensor(inputs[0])
        if self.is_noop(out, src):
            return  # the field is a view of its source: copying onto itself changes nothing
        if out.shape == src.shape:
            out.copy_(src)
        elif self.flat:
            out.view(-1).copy_(src.view(-1)[: out.numel()])
        else:
            out.copy_(src[: out.shape[0]])

    def emit_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        k = kernel
        src = _tensor(inputs[0])
        if self.flat or out.dim() == 1:
            if _same_flat(out, src):
                k.emit("# (copy onto itself: nothing to do)")
                return
            k.store1d(out, k.load1d(src, names[1]), names[0])
            return
        if out.data_ptr() == src.data_ptr() and out.stride() == src.stride():
            k.emit("# (copy onto itself: nothing to do)")
            return
        rows, cols = out.shape[0], out.shape[1]
        m = k.mask(rows)
        k.emit(f"for c in range(0, {cols}, 32):")
        k.emit("    cs = c + tl.arange(0, 32)")
        k.emit(f"    mm = ({m})[:, None] & (cs < {cols})[None, :]")
        k.emit(f"    val = tl.load({k.ptr(src, names[1])} + offs[:, None] * {src.stride(0)} + "
               f"cs[None, :] * {src.stride(1)}, mask=mm)")
        k.emit(f"    tl.store({k.ptr(out, names[0])} + offs[:, None] * {out.stride(0)} + "
               f"cs[None, :] * {out.stride(1)}, val, mask=mm)")


def _same_flat(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` flattened is the leading part of ``b`` flattened (a copy onto itself)."""
    return (
        a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.is_contiguous()
        and b.is_contiguous() and a.numel() <= b.numel()
    )


@attrs.frozen
class ExpandBlockTable(Derivation):
    """The block table expanded to one physical row per token: ``out[r, j * B + o] =
    block_table[r, j] * B + o`` for block size ``B`` (vLLM's CPU ``AMX_MLA`` decode state,
    ``req_to_token``). The block size is the field's width over the block table's.

    Inputs: the block table. A refresh, not an increment: the field follows whatever the block
    table holds at the step, which an expansion kept from another batch (the one a graph was
    captured with) would not.
    """

    name: ClassVar[str] = "expand_block_table"
    arguments: ClassVar[tuple[Argument, ...]] = ("tensor",)
    checks_layout_only: ClassVar[bool] = True

    @property
    def formula(self) -> str:  # type: ignore[override]
        return "block_table[r, t // B] * B + t % B, B = field width / block table width"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
            return argument_problem(inputs, self.arguments)
        table = inputs[0]
        if out.dim() != 2 or table.dim() != 2:
            return (f"needs a 2-D field and block table, got {tuple(out.shape)} and "
                    f"{tuple(table.shape)}")
        if table.shape[1] == 0 or out.shape[1] % table.shape[1]:
            return (f"the field's width {out.shape[1]} is no multiple of the block table's "
                    f"{table.shape[1]}")
        if table.shape[0] < out.shape[0]:
            return f"block table has {table.shape[0]} rows, fewer than the field's {out.shape[0]}"
        if out.dtype != table.dtype:
            return f"the field is {out.dtype}, the block table {table.dtype}: they must match"
        return _same_device(out, table)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        table = _tensor(inputs[0])
        rows, blocks = out.shape[0], table.shape[1]
        size = out.shape[1] // blocks
        expanded = out.view(rows, blocks, size)
        torch.mul(table[:rows].unsqueeze(-1).expand(rows, blocks, size), size, out=expanded)
        expanded.add_(workspace.arange(size, out.dtype, out.device))

