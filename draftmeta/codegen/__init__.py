"""Generated update functions: one function per spec, its source readable and in tracebacks.

Like attrs and dataclasses generate ``__init__`` from field declarations, draftmeta generates, from
a spec, the source text of one function that applies every rule in place, compiles it once and
registers it with :mod:`linecache` so tracebacks and debuggers show the generated lines.

The generated function runs in phases, so that a failed update leaves the metadata untouched:

0. the object and its nested records: exactly the declared classes, no instance attribute
   outside the spec (on every call: one type test and one set comparison per record);
1. preconditions (raise :class:`~draftmeta.errors.PreconditionFailed`);
2. structure checks: nested records present, aliases still sharing storage with their source,
   host ints of the state in range (raise :class:`~draftmeta.errors.UpdateError`);
3. new host values computed into locals; formula inputs of the right shape, dtype and device;
   the memory check;
4. tensor writes, in declaration order, in place;
5. host values stored.

Five functions can be generated from one spec (:data:`~draftmeta.codegen.product.Part`): the
update, its checks alone, the rest after the checks (around a fused kernel), and a seal and step
for an object updated at many steps. They differ only in which phases they run and in a few
flags, so each is one row of a table of data (``_VARIANTS`` in :mod:`draftmeta.codegen.phases`:
its name, docstring, phases in order, flags), read side by side, rather than a generator
subclass each or tests of a flag in every phase.

:func:`~draftmeta.codegen.phases.generate` returns one
:class:`~draftmeta.codegen.product.GeneratedUpdate`: the source, the globals it reads and a map
from each line a rule wrote to that rule's field. :func:`~draftmeta.codegen.compiler.explain`
prints it, :meth:`GeneratedUpdate.compile <draftmeta.codegen.product.GeneratedUpdate.compile>`
(behind :attr:`DraftSpec.update <draftmeta.spec.DraftSpec.update>`, :attr:`DraftSpec.sealed
<draftmeta.spec.DraftSpec.sealed>` and :class:`~draftmeta.fused.FusedStep`) is the one place it
is compiled. A write that raises is reported as :class:`~draftmeta.errors.WriteFailed` naming
its field through that map (the line the exception left the function at), so the writes
themselves carry no marker.

The package only drives the phases: every line that depends on a rule comes from the rule
itself (its ``lower_*`` methods, :class:`~draftmeta.rules.Rule`), written through a
:class:`~draftmeta.rules.Emitter` that it implements. Modules, one job each, from the bottom:

* :mod:`draftmeta.codegen.spec_view`: what it reads of a spec (:class:`SpecView`, which
  :class:`~draftmeta.spec.DraftSpec` satisfies: codegen never imports the spec's module);
* :mod:`draftmeta.codegen.runtime`: what generated code calls at run time;
* :mod:`draftmeta.codegen.writer`: the source writer (lines, the line map, names);
* :mod:`draftmeta.codegen.describe`: the header :func:`explain` puts before the source;
* :mod:`draftmeta.codegen.product`: :class:`GeneratedUpdate` and the compiled functions'
  signatures;
* :mod:`draftmeta.codegen.phases`: the phases, the five variants, :func:`generate`;
* :mod:`draftmeta.codegen.compiler`: :func:`compile_spec`, :func:`compile_sealed`,
  :func:`explain`.
"""

from __future__ import annotations

from draftmeta.codegen.compiler import compile_sealed, compile_spec, explain
from draftmeta.codegen.describe import describe_bound
from draftmeta.codegen.phases import generate
from draftmeta.codegen.product import (
    GeneratedUpdate,
    Part,
    SealFunction,
    StepFunction,
    UpdateFunction,
)
from draftmeta.codegen.spec_view import SpecView

__all__ = ["GeneratedUpdate", "Part", "SealFunction", "SpecView", "StepFunction",
           "UpdateFunction", "compile_sealed", "compile_spec", "describe_bound", "explain",
           "generate"]
