"""Emit an inferred spec as Python source a maintainer can paste, with its evidence per field."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping, Sequence

import attrs

from draftmeta.infer.classify import TodoHook, Verdict
from draftmeta.refs import identifier
from draftmeta.rules import (
    Derive,
    HostDerive,
    Recompute,
    Reset,
    Rule,
    same_value,
)

__all__ = ["render_rule", "source"]


def _import(obj: object, imports: set[tuple[str, str]]) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    module, name = cls.__module__, cls.__qualname__
    if module == "builtins":
        return name
    if module.startswith("draftmeta.") and module.count(".") > 1 and module.startswith(
        "draftmeta.rules"
    ):
        module = "draftmeta.rules"
    imports.add((module, name.split(".")[0]))
    return name


def _hook_expression(hook: object, imports: set[tuple[str, str]]) -> str:
    """The hook's constructor call: its ``repr``, plus the fields its ``repr`` hides (a kernel
    handed in) where they are set, as the module-level functions they are, imported; a hidden
    value that is no importable function is refused rather than dropped."""
    text = repr(hook)
    cls = type(hook)
    if not attrs.has(cls):
        return text
    hidden = []
    for field in attrs.fields(cls):
        value = getattr(hook, field.name)
        if field.repr or value is field.default:
            continue
        module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if not module or "<" in name or "." in name:
            raise ValueError(
                f"cannot write {type(hook).__name__}.{field.name} = {value!r} as source: it is "
                "not a module-level function; hand the spec a named function")
        imports.add((module, name))
        hidden.append(f"{field.name}={name}")
    return text if not hidden else f"{text[:-1]}, {', '.join(hidden)})"


def _stub_name(path: str) -> str:
    return "Todo" + "".join(p.capitalize() for p in identifier(path).split("_")) + "Hook"


def _import_lines(imports: set[tuple[str, str]], width: int = 88) -> list[str]:
    """The import block as isort (and ruff's ``I`` rules) lay it out in a user's project: the
    standard library, then everything else (draftmeta and vLLM are third-party there), each
    section ``import x`` lines first, then ``from x import ...`` lines, sorted, wrapped in
    parentheses past ``width`` columns."""
    sections: list[list[str]] = []
    for stdlib in (True, False):
        modules = sorted({m for m, _ in imports
                          if (m.split(".")[0] in sys.stdlib_module_names) == stdlib})
        plain = [f"import {m}" for m in modules if (m, "") in imports]
        froms = []
        for module in modules:
            names = sorted(n for m, n in imports if m == module and n)
            if not names:
                continue
            line = f"from {module} import {', '.join(names)}"
            if len(line) > width:
                line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"
            froms.append(line)
        if plain or froms:
            sections.append(plain + froms)
    out: list[str] = []
    for section in sections:
        out += [*section, ""]
    return out[:-1]


def render_rule(rule: Rule, imports: set[tuple[str, str]], stubs: list[str]) -> str:
    """The rule as a Python expression; names it uses are added to ``imports``, stub hook
    classes it needs to ``stubs``."""
    if isinstance(rule, HostDerive):
        if rule.fn is same_value and len(rule.inputs) == 1:
            imports.add(("draftmeta.rules", "copy_of"))
            return f"copy_of({rule.inputs[0]!r})"
        _import(rule, imports)
        fn = repr(rule.fn)
        _import(rule.fn, imports)
        return f"HostDerive({fn}, {rule.inputs!r}, formula={rule.formula!r})"
    if isinstance(rule, Recompute) and isinstance(rule.hook, TodoHook):
        _import(rule, imports)
        name = _stub_name(rule.hook.path)
        stubs.append(_stub_source(name, rule.hook.path))
        return f"Recompute({name}(), ())"
    if isinstance(rule, Recompute):
        _import(rule, imports)
        _import(rule.hook, imports)
        return f"Recompute({_hook_expression(rule.hook, imports)}, {rule.inputs!r})"
    if isinstance(rule, Derive):
        _import(rule, imports)
        _import(rule.derivation, imports)
        return f"Derive({rule.derivation!r}, {rule.inputs!r})"
    if isinstance(rule, Reset):
        _import(rule, imports)
        factory = _import(rule.factory, imports)
        return f"Reset({factory}, label={rule.label!r})"
    _import(rule, imports)
    return repr(rule)


def _stub_source(name: str, path: str) -> str:
    return f'''

class {name}(RecomputeHook):
    """TODO: refill {path} in place (draftmeta infer could not explain how it changes)."""

    name = "{identifier(path)}"
    formula = "TODO"

    def check(self, out, *inputs, also=()):
        return "TODO: write the recompute hook of {path}"  # fails until written

    def apply(self, out, *inputs, workspace, also=()):
        raise NotImplementedError
'''


def _annotation(annotation: object, imports: set[tuple[str, str]]) -> str:
    if isinstance(annotation, types.UnionType):
        return " | ".join(_annotation(a, imports) for a in annotation.__args__)
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        if annotation.__module__ == "torch":
            imports.add(("torch", ""))
            return f"torch.{annotation.__qualname__}"
        return _import(annotation, imports)
    return repr(annotation)


def source(
    *,
    name: str,
    cls: type,
    verdicts: Sequence[Verdict],
    nested: Mapping[str, type],
    header: str = "",
) -> str:
    """The spec as a module: imports, stub hooks, and ``spec()`` returning the ``DraftSpec``."""
    imports: set[tuple[str, str]] = {("draftmeta", "DraftSpec"), ("typing", "Any")}
    stubs: list[str] = []
    cls_name = _import(cls, imports)
    body = []
    for v in verdicts:
        expr = render_rule(v.rule, imports, stubs)
        mark = "" if v.settled else "UNSETTLED: "
        body.append(f"            # {mark}{v.evidence}\n            {v.path!r}: {expr},")
    nested_text = ", ".join(f"{p!r}: {_import(c, imports)}" for p, c in nested.items())
    attributes = [(v.path, _annotation(v.annotation, imports)) for v in verdicts if v.attribute]
    attr_text = ", ".join(f"{p!r}: {a}" for p, a in attributes)
    if stubs:
        imports.add(("draftmeta.derivations", "RecomputeHook"))
    lines = [f'"""{header or f"Spec of {name}, inferred by draftmeta infer."}"""', "",
             "from __future__ import annotations", ""]
    lines += _import_lines(imports)
    text = "\n".join(lines) + "\n" + "".join(stubs)
    text += f'''

def spec() -> DraftSpec[Any]:
    """The inferred spec of {name}."""
    return DraftSpec(
        {cls_name},
        {{
{chr(10).join(body)}
        }},
        name={name!r},
        nested={{{nested_text}}},
        attributes={{{attr_text}}},
    )
'''
    return text
