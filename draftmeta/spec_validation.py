"""The rules of a spec checked, when it is declared, against its field tree and each other.

:func:`validate_rules` is the second half of declaring a :class:`~draftmeta.spec.DraftSpec`
(:func:`~draftmeta.spec_tree.read_tree` is the first): every key a field with one rule, each rule
fitting its field, every field covered, every reference existing and of a kind the rule reads,
a ``Recompute``'s extra outputs and their ``WrittenBy`` rules agreeing, formulas given the
inputs they take, no host value stored into a frozen record, and no derived field reading one
updated after it or in a cycle. Each check is a function; the first problem raises
:class:`~draftmeta.errors.SpecError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import torch

from draftmeta.conditions import Precondition
from draftmeta.fields import FieldKind
from draftmeta.refs import STATE_PREFIX, is_state_ref
from draftmeta.rules import Rule
from draftmeta.spec_tree import STATE_FIELDS, SpecTree, describe_kind

__all__ = ["validate_rules"]


def validate_rules(
    tree: SpecTree, rules: Mapping[str, Rule], preconditions: Sequence[Precondition]
) -> None:
    """Check ``rules`` (a rule per field path, in declaration order) and ``preconditions``
    against ``tree``, in this order: the keys, each rule's fit to its field, completeness,
    references, recompute hooks' extra outputs, ``WrittenBy``, formula inputs, frozen records,
    and the order of derived fields.

    Raises:
        SpecError: the first problem found, naming the field and the fix.
    """
    _check_rules_known(tree, rules)
    _check_rules_fit(tree, rules)
    _check_complete(tree, rules)
    _check_references(tree, rules, preconditions)
    _check_hook_outputs(tree, rules)
    _check_written_by(tree, rules)
    _check_formulas(tree, rules)
    _check_frozen(tree, rules)
    _check_order(tree, rules)


def _check_rules_known(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    for path, rule in rules.items():
        if not isinstance(path, str):
            raise tree.fail(str(path), "rule keys must be field paths (str)", "use 'a.b'")
        if not isinstance(rule, Rule):
            raise tree.fail(
                path,
                f"bound to {rule!r}, which is not a Rule",
                "bind a rule object such as Unchanged() or Alias('seq_lens')",
            )
        if path not in tree.fields:
            raise tree.unknown(path, "the spec")
        ancestor = path
        while "." in ancestor:
            ancestor = ancestor.rsplit(".", 1)[0]
            if ancestor in rules:
                raise tree.fail(
                    path,
                    f"has a rule, but so has its enclosing record {ancestor!r} "
                    f"({rules[ancestor].kind})",
                    f"give rules either to {ancestor!r} as a whole or to each of its fields",
                )


def _check_rules_fit(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    for path, rule in rules.items():
        info = tree.fields[path]
        dtype = tree.dtype_of(path)
        kind = info.kind
        what = describe_kind(info, dtype)
        target = rule.target
        if kind is FieldKind.GENERIC and path not in tree.nested and target != "any":
            raise tree.fail(
                path,
                f"is typed by the TypeVar {info.annotation}, so its class is unknown",
                f"pass nested={{{path!r}: TheConcreteClass}} if it holds a record, or "
                f"dtypes={{{path!r}: torch.int32}} (its dtype) if it holds a tensor",
            )
        misfit = rule.field_problem(info)
        if misfit is not None:
            raise tree.fail(path, *misfit)
        if target == "tensor" and kind is not FieldKind.TENSOR:
            raise tree.fail(
                path,
                f"rule {rule.kind} needs a tensor field, but the field is {what}",
                "use a host rule (HostConstant, HostAdvance, HostUpperBound, HostDerive, "
                "HostSet) for host values, Reset for host objects",
            )
        if target == "int tensor":
            if kind is not FieldKind.TENSOR:
                raise tree.fail(
                    path,
                    f"rule {rule.kind} needs an integer tensor, but the field is {what}",
                    "use HostAdvance for host ints",
                )
            if dtype is not None and (dtype.is_floating_point or dtype is torch.bool
                                      or dtype.is_complex):
                raise tree.fail(
                    path,
                    f"rule {rule.kind} needs an integer tensor, but the field is {what}",
                    "advance only integer tensors (positions, lengths); derive other fields",
                )
        if target in ("host", "int") and kind in (
            FieldKind.TENSOR, FieldKind.RECORD, FieldKind.GENERIC
        ):
            raise tree.fail(
                path,
                f"host rule {rule.kind} cannot update {what} in place",
                "use Alias, Advance, Derive or Recompute for tensors; Unchanged or Reset "
                "for nested records",
            )
        if target == "int" and kind is not FieldKind.INT:
            raise tree.fail(
                path,
                f"rule {rule.kind} needs a host int, but the field is {what}",
                "use HostConstant or HostDerive for other host values",
            )
        if target == "object" and kind in (
            FieldKind.TENSOR, FieldKind.INT, FieldKind.BOOL, FieldKind.FLOAT
        ):
            raise tree.fail(
                path,
                f"rule {rule.kind} replaces a host object, but the field is {what}",
                "use Derive or Recompute for tensors and host rules for scalars",
            )


def _check_complete(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    missing: list[str] = []
    unresolved: list[str] = []
    for path, info in tree.fields.items():
        if _covered(rules, path):
            continue
        if path in tree.records:  # a nested record without a rule: its fields need rules
            continue
        if info.kind is FieldKind.GENERIC:
            unresolved.append(path)
        else:
            missing.append(path)
    if unresolved:
        path = unresolved[0]
        raise tree.fail(
            path,
            f"is typed by the TypeVar {tree.fields[path].annotation} and has no rule, so "
            "its fields are unknown",
            f"pass nested={{{path!r}: TheConcreteClass}}, or cover it with Unchanged() "
            "if it stays the same",
        )
    if missing:
        listed = ", ".join(repr(p) for p in missing)
        raise tree.fail(
            missing[0],
            f"has no rule ({len(missing)} field(s) without a rule: {listed}); every field "
            "must say how it changes per draft step",
            f"add a rule for each, e.g. {missing[0]!r}: Unchanged() if it keeps its value",
        )


def _covered(rules: Mapping[str, Rule], path: str) -> bool:
    if path in rules:
        return True
    probe = path
    while "." in probe:
        probe = probe.rsplit(".", 1)[0]
        rule = rules.get(probe)
        if rule is not None:
            return rule.covers_record
    return False


def _check_references(tree: SpecTree, rules: Mapping[str, Rule],
                       preconditions: Sequence[Precondition]) -> None:
    for path, rule in rules.items():
        for ref in rule.reads():
            tree.check_ref(path, ref)
            read = tree.ref_info(ref)
            misfit = rule.reference_problem(ref, read.kind, describe_kind(read, None))
            if misfit is not None:
                raise tree.fail(path, *misfit)
            if ref == path:
                raise tree.fail(
                    path,
                    f"rule {rule.kind} reads the field it writes",
                    "derive the field from other fields or the draft state; use Advance "
                    "for a field that grows from its own value",
                )
        for bound in rule.bounds():
            info = STATE_FIELDS.get(bound)
            if info is None or info.kind is not FieldKind.INT:
                ints = [n for n, f in STATE_FIELDS.items() if f.kind is FieldKind.INT]
                raise tree.fail(
                    path,
                    f"rule {rule.kind} is bounded by {bound!r}, which is not a host int of "
                    "the draft state",
                    f"bound by one of {', '.join(ints)}",
                )
        if rule.advances_padded_rows:
            raise tree.fail(
                path,
                f"rule {rule.kind} advances rows at or past state.num_reqs (padding), but "
                "the source advance leaves padded rows where they are, so the field would "
                "drift from the state in padded rows",
                rule.padded_rows_fix,
            )
    for cond in preconditions:
        if not isinstance(cond, Precondition):
            raise tree.fail(
                "", f"precondition {cond!r} is not a Precondition", "use Equals(...) etc."
            )
        for ref in cond.reads():
            tree.check_ref(f"<precondition {cond.name}>", ref)
            if cond.host_only and tree.is_tensor_ref(ref):
                raise tree.fail(
                    "",
                    f"precondition {cond.name!r} compares the tensor {ref!r} on the host, "
                    "which would wait for the device",
                    "check host scalars only",
                )


def _check_hook_outputs(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    """What a ``Recompute`` lists in ``also=``: distinct tensor fields of the metadata,
    other than its own field and its inputs, each refilled by one hook only."""
    owners: dict[str, str] = {}
    for path, rule in rules.items():
        outputs = rule.also_writes()
        for i, extra in enumerate(outputs):
            if extra == path:
                raise tree.fail(
                    path,
                    "lists its own field in also=, but a Recompute always refills its own "
                    "field; also= names the hook's other outputs",
                    f"remove {path!r} from also=",
                )
            if extra in outputs[:i]:
                raise tree.fail(
                    path, f"lists {extra!r} twice in also=", f"list {extra!r} once",
                )
            if is_state_ref(extra):
                raise tree.fail(
                    path,
                    f"lists the draft-state buffer {extra!r} in also=, but a hook refills "
                    "metadata buffers only (the draft loop advances the state)",
                    f"remove {extra!r} from also=",
                )
            info = tree.fields.get(extra)
            if info is None:
                raise tree.unknown(extra, f"also= of {path!r}")
            if info.kind is not FieldKind.TENSOR:
                raise tree.fail(
                    path,
                    f"lists {extra!r} in also=, which is "
                    f"{describe_kind(info, tree.dtype_of(extra))}; a hook refills tensor "
                    "buffers only",
                    f"remove {extra!r} from also= and give it a rule of its own",
                )
            first = owners.setdefault(extra, path)
            if first != path:
                raise tree.fail(
                    extra,
                    f"is listed in also= of both {first!r} and {path!r}, but one kernel "
                    "call refills a buffer",
                    f"keep {extra!r} in the also= of the hook that computes it and remove "
                    "it from the other's",
                )
            read = next((r for r in rule.reads() if _overlaps(r, extra)), None)
            if read is not None:
                raise tree.fail(
                    path,
                    f"reads {read!r}, which its own hook refills (also={extra!r}), so the "
                    "kernel would read a buffer while overwriting it",
                    f"remove {read!r} from the inputs of {path!r}: compute the hook from the "
                    "fields or draft-state buffers that buffer is computed from",
                )


def _check_written_by(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    for path, rule in rules.items():
        owner_path = rule.written_by
        if owner_path is not None:
            owner = rules.get(owner_path)
            if owner_path == path:
                raise tree.fail(
                    path,
                    "is declared written by itself",
                    "give the field its own Recompute(hook, inputs) rule",
                )
            info = tree.fields.get(owner_path)
            if info is None:
                raise tree.unknown(owner_path, f"WrittenBy of {path!r}")
            if info.kind is not FieldKind.TENSOR:
                raise tree.fail(
                    path,
                    f"is written by {owner_path!r}, which is "
                    f"{describe_kind(info, tree.dtype_of(owner_path))}; only a tensor "
                    "field's Recompute hook writes other fields",
                    "name the tensor field whose Recompute rule lists this one in also=",
                )
            if owner is None or path not in owner.also_writes():
                raise tree.fail(
                    path,
                    f"is written by {owner_path!r}, but that field's rule is not a Recompute "
                    "listing it in also=",
                    f"give {owner_path!r} Recompute(hook, inputs, also=({path!r},))",
                )
        for extra in rule.also_writes():  # each a field: _check_hook_outputs ran first
            other = rules.get(extra)
            if other is None or other.written_by != path:
                raise tree.fail(
                    extra,
                    f"is refilled by the recompute hook of {path!r} but its rule is not "
                    f"WrittenBy({path!r})",
                    f"bind {extra!r}: WrittenBy({path!r})",
                )


def _check_formulas(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    """A formula's or hook's inputs (``Derive``, ``Recompute``): as many as it takes, of the
    kinds it takes."""
    for path, rule in rules.items():
        fn = rule.in_place_function
        if fn is None:
            continue
        kinds = fn.arguments
        if kinds is None:
            continue
        inputs = rule.reads()
        if len(inputs) != len(kinds):
            raise tree.fail(
                path,
                f"{fn.name} takes {len(kinds)} input(s) ({', '.join(kinds) or 'none'}), "
                f"but the rule gives {len(inputs)}: {list(inputs)}",
                f"give {fn.name} exactly {len(kinds)} input(s), in the order "
                f"{type(fn).__qualname__}'s docstring lists",
            )
        for i, (ref, kind) in enumerate(zip(inputs, kinds)):
            info = (STATE_FIELDS[ref[len(STATE_PREFIX):]] if is_state_ref(ref)
                    else tree.fields[ref])
            actual = info.kind
            wrong = (
                (kind == "tensor" and actual is not FieldKind.TENSOR)
                or (kind == "int" and actual is not FieldKind.INT)
            )
            if wrong:
                raise tree.fail(
                    path,
                    f"input {i} of {fn.name} must be a {'host int' if kind == 'int' else kind}"
                    f", but {ref!r} is {describe_kind(info, None)}",
                    f"pass a {'host int' if kind == 'int' else kind} reference as input {i}",
                )


def _check_frozen(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    """Host rules store new values with setattr: a frozen record cannot take them."""
    for path, rule in rules.items():
        if not rule.stores_host_value:
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        cls = tree.records.get(parent)
        if cls is not None and _frozen(cls):
            where = f"{parent!r}" if parent else "the metadata class"
            raise tree.fail(
                path,
                f"rule {rule.kind} stores a new value each step, but {where} "
                f"({cls.__qualname__}) is frozen, so the store would fail mid-update",
                "make the class mutable, or declare the spec Unsupported for it so the "
                "builder rebuilds",
            )


def _writer(rules: Mapping[str, Rule], path: str) -> str | None:
    rule = rules.get(path)
    if rule is not None and rule.written_by is not None:
        return rule.written_by
    return path if rule is not None and rule.writes else None


def _check_order(tree: SpecTree, rules: Mapping[str, Rule]) -> None:
    written = [p for p, r in rules.items() if r.writes]
    outputs = {p: _writer(rules, p) for p in rules if _writer(rules, p)}
    deps: dict[str, list[str]] = {}
    via: dict[tuple[str, str], str] = {}  # (reader, writer) -> the output it reads
    for path in written:
        reads = [r for r in rules[path].reads() if not is_state_ref(r)]
        found: set[str] = set()
        for out, writer in outputs.items():
            read = next((r for r in reads if _overlaps(out, r)), None)
            if writer and writer != path and read is not None:
                found.add(writer)
                via.setdefault((path, writer), out if out != writer else read)
        deps[path] = [w for w in written if w in found]

    def reads_text(reader: str, writer: str) -> str:
        out = via[(reader, writer)]
        if out == writer or _overlaps(out, writer):
            return f"reads {out!r}"
        return f"reads {out!r}, which the recompute hook of {writer!r} refills"

    cycle = _find_cycle(deps)
    if cycle:
        chain = " -> ".join(repr(p) for p in cycle)
        hooks = [f"{a!r} {reads_text(a, b)}" for a, b in itertools.pairwise(cycle)
                 if "recompute hook" in reads_text(a, b)]
        if hooks:
            chain += f" ({'; '.join(hooks)})"
        raise tree.fail(
            cycle[0],
            f"derived fields depend on each other in a cycle: {chain}",
            "break the cycle: derive one of them from the draft state or an unchanged field",
        )
    order = {p: i for i, p in enumerate(rules)}
    for path in written:
        for dep in deps[path]:
            if order[dep] > order[path]:
                raise tree.fail(
                    path,
                    f"{reads_text(path, dep)}, but {dep!r} is also updated and declared "
                    "later, so it is ambiguous whether the old or the new value is meant",
                    f"declare {dep!r} before {path!r}; updates run in declaration order and "
                    "always read values already updated this step",
                )


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in deps.get(node, ()):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _frozen(cls: type) -> bool:
    """Whether instances of a dataclass or attrs class refuse attribute assignment."""
    params = getattr(cls, "__dataclass_params__", None)
    if dataclasses.is_dataclass(cls) and params is not None and params.frozen:
        return True
    setattr_ = getattr(cls, "__setattr__", None)
    return getattr(setattr_, "__name__", "") == "_frozen_setattrs"
