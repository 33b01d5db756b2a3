"""Which vLLM builders draftmeta covers on which draft path, and why: ``draftmeta coverage``.

The report reads the same plan the plugin installs
(:func:`~draftmeta.integrations.vllm.plan.make_plan`), so what it says is what the plugin does.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from draftmeta.integrations.vllm.catalogue import DEFAULT_RELEASE, installed_version, release

__all__ = ["coverage", "coverage_table"]


def _plugin_state(version: str | None) -> dict[str, Any]:
    from importlib.metadata import entry_points

    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.plan import Unsupported, make_plan

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "draftmeta"]
    allow = os.environ.get("VLLM_PLUGINS")
    enabled = not plugin._disabled() and (allow is None or "draftmeta" in allow.split(","))
    state: dict[str, Any] = {"installed": bool(found), "enabled": enabled, "active": False,
                             "reason": ""}
    if version is None:
        state["reason"] = "vLLM is not installed"
    elif not found:
        state["reason"] = "the vllm.general_plugins entry point is missing: reinstall draftmeta"
    elif plugin._disabled():
        state["reason"] = f"turned off by {plugin.DISABLE_ENV}"
    elif not enabled:
        state["reason"] = "VLLM_PLUGINS does not list draftmeta"
    else:
        try:
            plan = make_plan(version)
        except Unsupported as exc:
            state["reason"] = str(exc)
        else:
            active = any(d.installs for d in plan.decisions)
            state["active"] = active
            state["reason"] = ("vLLM loads it in every process" if active
                               else "no builder of this release needs it")
    return state


def coverage() -> dict[str, Any]:
    """The report as one JSON-ready object.

    Keys: ``vllm_version`` (``None`` without vLLM), ``release`` (the catalogue used),
    ``supported`` (the supported releases), ``plugin`` (``installed``, ``enabled``, ``active``,
    ``reason``), ``builders`` (one object per builder and draft path: ``backend``, ``builder``,
    ``path``, ``covered_by``, ``reason``) and ``blocking_full_capture`` (builders that keep
    vLLM's new runner rebuilding every group, and so from capturing the whole draft loop).
    """
    from draftmeta.integrations.vllm.catalogue import releases
    from draftmeta.integrations.vllm.plan import Unsupported, make_plan

    version = installed_version()
    report: dict[str, Any] = {
        "vllm_version": version,
        "release": None,
        "supported": [r.version for r in releases()],
        "plugin": _plugin_state(version),
        "builders": [],
        "blocking_full_capture": [],
    }
    if version is None:
        report["release"] = DEFAULT_RELEASE
        for entry in release(DEFAULT_RELEASE).builders:
            report["builders"].append({
                "backend": entry.name, "builder": entry.builder.qualname, "path": "-",
                "covered_by": "none", "reason": "vLLM is not installed",
            })
        return report
    try:
        plan = make_plan(version)
    except Unsupported as exc:
        report["plugin"]["reason"] = str(exc)
        return report
    report["release"] = plan.release.version
    for d in plan.decisions:
        report["builders"].append({
            "backend": d.entry.name, "builder": d.entry.builder.qualname, "path": d.path,
            "covered_by": d.covered_by, "reason": d.reason,
        })
    if "hook" in plan.release.paths:
        report["blocking_full_capture"] = list(plan.blocking_full_capture())
    return report


def coverage_table(report: dict[str, Any] | None = None, *, width: int = 100) -> str:
    """:func:`coverage` as plain text, at most ``width`` columns wide."""
    report = report if report is not None else coverage()
    plugin = report["plugin"]
    state = "active" if plugin["active"] else "inactive"
    lines = [
        f"vLLM {report['vllm_version'] or '(not installed)'}; catalogue {report['release']} "
        f"(supported: {', '.join(report['supported'])})",
        f"plugin: {state} (installed={plugin['installed']}, enabled={plugin['enabled']}): "
        f"{plugin['reason']}",
        "",
    ]
    head = f"{'backend':<28} {'path':<15} {'covered by':<10} "
    lines.append(head + "reason")
    indent = " " * len(head)
    for row in report["builders"]:
        first = f"{row['backend']:<28} {row['path']:<15} {row['covered_by']:<10} "
        wrapped = textwrap.wrap(row["reason"], width - len(head)) or [""]
        lines.append(first + wrapped[0])
        lines.extend(indent + more for more in wrapped[1:])
    if report["blocking_full_capture"]:
        blockers = ", ".join(report["blocking_full_capture"])
        lines.append("")
        lines.extend(textwrap.wrap(
            f"Without vLLM's or draftmeta's hook, these builders make the new runner rebuild "
            f"every group and keep the draft loop out of one captured graph: {blockers}", width))
    return "\n".join(line.rstrip() for line in lines)
