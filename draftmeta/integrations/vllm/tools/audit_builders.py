"""Which builders of the installed vLLM have a draft hook, and how the audit builds each.

:func:`hooked_builders` lists every builder whose ``update_draft_decode_metadata`` vLLM's
runner would call (vLLM's own, declared by its class; draftmeta's, where the plugin's plan gives
one), from the release's catalogue and then vLLM's backend registry, each as a
:class:`HookedBuilder`: whether it builds on the audit's device (and, where it does not, why,
with the command for a GPU machine, :func:`gpu_command`), how (the catalogue's recipe, or one
made from the registry's backend on a GPU), with which KV caches and whether under DCP too.
The audit (:mod:`draftmeta.integrations.vllm.tools.audit`) drives them.
"""

from __future__ import annotations

from typing import Any

import attrs

from draftmeta.integrations.vllm.catalogue import HarnessRecipe
from draftmeta.integrations.vllm.catalogue.classes import ClassRef, kernel_library_loaded_once
from draftmeta.integrations.vllm.plugin.plan import CoveredBy
from draftmeta.integrations.vllm.tools.audit_drive import Device

__all__ = ["HookedBuilder", "gpu_command", "hooked_builders", "registry_backend"]


def gpu_command(*names: str) -> str:
    """The command that audits ``names`` (every hook, without names) on a GPU machine with
    this vLLM: what a row that needs a GPU says to run."""
    return " ".join(["draftmeta audit --device cuda", *names])


@attrs.frozen
class HookedBuilder:
    """A builder of the installed vLLM whose draft hook the audit knows of.

    Attributes:
        name: vLLM's attention-backend name (the catalogue's name where it has one).
        builder: the builder class's qualified name.
        owner: whose hook vLLM would call, as far as the class tells (an instance may still
            turn its flag off: under DCP, without full CUDA graphs).
        runs_here: ``None`` where the audit builds it on this device, else why not.
        dcp: audit it under decode context parallelism too: draftmeta's hook serves it there
            (where vLLM declares none, or where draftmeta's is the only one).
        standard: a standard-attention backend outside the catalogue, built for a tiny Llama
            (:func:`~draftmeta.integrations.vllm.testing.harness.make_attention_builder`);
            where it does not construct here, its row says why.
        recipe: how to build it where its catalogue entry has no recipe for this device (an
            MLA backend of vLLM's registry, built with its own layer, on a GPU).
        kv_cache_dtypes: the KV caches it is audited with (FlashMLA: bf16 and FP8, on a GPU).
        flashmla: FlashMLA's dense decode checks its schedule (on a GPU).
    """

    name: str
    builder: str
    owner: CoveredBy
    runs_here: str | None
    dcp: bool = False
    standard: bool = False
    recipe: HarnessRecipe | None = None
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    flashmla: bool = False


_PLUGIN_HOOKS = "draftmeta.integrations.vllm.plugin.hook"
"""The module whose functions the plugin installs as hooks."""


def _declares_hook(cls: type) -> bool:
    """Whether vLLM's own code gives ``cls`` a hook: the nearest definition in its class
    hierarchy that is not draftmeta's (the plugin's replacement serves only the exact class it
    patched, and the catalogue lists those) is not the base class's."""
    from vllm.v1.attention.backend import AttentionMetadataBuilder

    for klass in cls.__mro__:
        hook = klass.__dict__.get("update_draft_decode_metadata")
        if hook is None or getattr(hook, "__module__", "") == _PLUGIN_HOOKS:
            continue
        return klass is not AttentionMetadataBuilder
    return False


def _registry_builders() -> dict[str, type | str]:
    """vLLM's attention backends by name: the builder class, or why it does not load here."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    found: dict[str, type | str] = {}
    for member in AttentionBackendEnum:
        try:
            with kernel_library_loaded_once():
                found[member.name] = member.get_class().get_builder_cls()
        except Exception as exc:  # a backend that does not load here: said in its row
            said = (str(exc).splitlines() or [""])[0]
            found[member.name] = f"{type(exc).__name__}: {said}"
    return found


def _import_problem(ref: ClassRef) -> str:
    """Why ``ref``'s class does not import here, as the import said it."""
    from draftmeta.integrations.vllm.catalogue.classes import import_class

    try:
        import_class(ref)
    except Exception as exc:  # the reason, whatever its type
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return "it imports now, not when the plan was made"


def registry_backend(name: str) -> Any:
    """vLLM's attention backend class ``name`` (its registry's), or ``None`` where it does not
    load here."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        with kernel_library_loaded_once():
            return AttentionBackendEnum[name].get_class()
    except Exception:  # does not load here: the caller lists it as not run
        return None


def _registry_recipe(name: str) -> HarnessRecipe | None:
    """A recipe that builds ``name``'s MLA builder with its own backend's layer (block size
    64, which every MLA kernel takes), where vLLM's registry loads it here."""
    backend = registry_backend(name)
    if backend is None or not backend.is_mla():
        return None
    return HarnessRecipe("mla", ClassRef(backend.__module__, backend.__qualname__),
                         block_size=64)


def hooked_builders(*, plugin: bool = True, device: Device = "cpu"
                    ) -> tuple[HookedBuilder, ...]:
    """Every builder of the installed vLLM with a draft hook: the catalogue's builders whose
    class declares one or to which draftmeta's plan (with ``plugin`` active) gives one, then
    every other backend of vLLM's registry whose builder class declares one; each with whether
    it builds on ``device`` (a CPU runs the catalogue's CPU recipes and the standard backends
    that construct there; a GPU every builder whose class loads)."""
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.plugin.plan import draft_path, make_plan
    from draftmeta.integrations.vllm.versions import installed_version

    version = installed_version()
    if version is None:
        raise RuntimeError("vLLM is not installed")
    release = current_release()
    audited = [path for path in map(draft_path, release.paths) if path.audited]
    if not audited:
        raise RuntimeError(f"vLLM {version} has no draft hook (update_draft_decode_metadata): "
                           "its draft loop rebuilds or takes the older proposer's path, so "
                           "there is no hook to audit")
    cuda = device == "cuda"
    rows: list[HookedBuilder] = []
    plan = make_plan(version)
    for decision in (d for path in audited for d in plan.on(path)):
        entry, cls = decision.entry, decision.cls
        ours = plugin and decision.covered_by == "draftmeta"
        # vLLM's own hook: its class declares one, or (a class that does not import here)
        # the catalogue says it does
        theirs = _declares_hook(cls) if cls is not None else entry.hook != "none"
        if not (ours or theirs or (plugin and decision.dcp_only)):
            continue
        recipe = None
        runs_here: str | None
        if cls is None:
            runs_here = f"does not import here ({_import_problem(entry.builder)})" + (
                "" if cuda else f"; on a GPU machine run {gpu_command(entry.name)}")
        elif entry.harness is not None or (cuda and entry.gpu_harness is not None):
            runs_here = None
        elif cuda:
            recipe = _registry_recipe(entry.name)
            runs_here = None if recipe is not None else "vLLM's registry does not load it here"
        else:
            runs_here = (f"its builder constructs only on a GPU: on a GPU machine run "
                         f"{gpu_command(entry.name)}")
        flashmla = getattr(entry.spec, "family", None) == "flashmla"
        rows.append(HookedBuilder(
            entry.name, entry.builder.qualname, "draftmeta" if ours else "vllm", runs_here,
            dcp=plugin and runs_here is None and (
                decision.dcp_only or (ours and entry.harness is None)),
            recipe=recipe, flashmla=flashmla,
            kv_cache_dtypes=("auto", "fp8") if flashmla and cuda else ("auto",)))
    known = set(release.names)
    for name, loaded in _registry_builders().items():
        if name in known or isinstance(loaded, str):  # a str: it does not load here
            continue
        if not _declares_hook(loaded):
            continue
        backend = registry_backend(name)
        standard = backend is not None and not backend.is_mla()
        recipe = None if standard or not cuda else _registry_recipe(name)
        if standard or recipe is not None:
            runs_here = None
        elif cuda:
            runs_here = "vLLM's registry does not load it here"
        else:
            runs_here = ("an MLA backend outside draftmeta's catalogue, built only on a GPU: "
                         f"on a GPU machine run {gpu_command(name)}")
        rows.append(HookedBuilder(name, loaded.__qualname__, "vllm", runs_here,
                                  standard=standard, recipe=recipe))
    return tuple(rows)
