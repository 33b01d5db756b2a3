"""Which vLLM builders draftmeta covers on which draft path, and why: ``draftmeta coverage``.

The report reads the same plan the plugin installs
(:func:`~draftmeta.integrations.vllm.plugin.plan.make_plan`), so what it says is what the plugin
does; what it says of each draft path (who covers a builder there while the plugin is inactive,
which engines its rows apply to, whether an uncovered builder blocks a captured loop) is that
path's declaration (:class:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind`).
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from draftmeta.integrations.vllm.catalogue import DEFAULT_RELEASE, installed_version, release

__all__ = ["PROOF", "coverage", "coverage_table"]

PROOF = {
    "CI": "equal to vLLM's own rebuild over random batches in draftmeta's CI, at every commit "
          "(CPU; draftmeta audit drives the hooks as vLLM 0.34's runner does)",
    "GPU": "equal to this release's own rebuild in a recorded GPU run, captured and replayed "
           "too (draftmeta coverage --json names each run: command, commit, device)",
    "CPU": "equal to this release's own rebuild in a recorded CPU run of draftmeta audit "
           "(draftmeta coverage --json names each run: command, commit, device)",
    "no": "declared, not yet proven: checked against the installed classes' fields only, and "
          "left to vLLM unless DRAFTMETA_VLLM_UNPROVEN=1; with it, draftmeta audit NAME run "
          "where the builder constructs checks it, and its --json output committed and named "
          "in the entry's proven_by proves it (docs/guide.md#proving-your-builder)",
}
"""What each value of a row's ``proven`` says."""


def _proof(entry: Any, release: str) -> str:
    return str(entry.proof_on(release) or "no")


def _runs(entry: Any, release: str) -> list[dict[str, str | None]]:
    """The recorded runs that prove ``entry`` on ``release``, as JSON objects."""
    import attrs

    return [attrs.asdict(run) for run in entry.runs_on(release)]


def _plugin_state(version: str | None) -> dict[str, Any]:
    from importlib.metadata import entry_points

    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.plugin.plan import Unsupported, make_plan

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
    ``path``, ``covered_by`` (what runs now: ``draftmeta`` only while the plugin is active),
    ``with_plugin`` (what would run with it active), ``reason``, ``proven`` (a key of
    :data:`PROOF`), ``proven_by`` (the recorded runs that prove it on this release: ``result``,
    ``command``, ``commit``, ``device``, ``vllm``, ``log``)), ``blocking_full_capture``
    (builders that keep vLLM's new runner rebuilding every group, and so from capturing the
    whole draft loop: those nobody covers on a path vLLM runs captured) and, for every declared
    draft path, ``<name>_engines`` (``hook_engines``, ``older_proposer_engines``: which engines a
    row of that path covered by draftmeta applies to, the path's
    :attr:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind.engines`, or ``None`` where
    the release does not have the path).
    """
    from draftmeta.integrations.vllm.catalogue import releases
    from draftmeta.integrations.vllm.plugin.plan import Unsupported, draft_paths, make_plan

    version = installed_version()
    report: dict[str, Any] = {
        "vllm_version": version,
        "release": None,
        "supported": [r.version for r in releases()],
        "plugin": _plugin_state(version),
        "builders": [],
        "blocking_full_capture": [],
        **{f"{path.name}_engines": None for path in draft_paths()},
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
    plugin = report["plugin"]
    for d in plan.decisions:
        path = plan.path_of(d)
        covered, reason = d.covered_by, d.reason
        if covered == "draftmeta" and not plugin["active"]:  # what runs is vLLM's own path
            covered = path.without_plugin(d.entry)
            reason = f"plugin inactive ({plugin['reason']}); with it active: {d.reason}"
        report["builders"].append({
            "backend": d.entry.name, "builder": d.entry.builder.qualname, "path": d.path,
            "covered_by": covered, "with_plugin": d.covered_by, "reason": reason,
            "proven": _proof(d.entry, plan.release.version),
            "proven_by": _runs(d.entry, plan.release.version),
        })
        if path.captured and covered == "none":
            report["blocking_full_capture"].append(d.entry.name)
    for path in plan.paths:
        report[f"{path.name}_engines"] = path.engines
    return report


def _paths(report: dict[str, Any]) -> list[str]:
    """The draft paths ``report``'s rows name, in their order."""
    return list(dict.fromkeys(r["path"] for r in report["builders"]))


def _summary(report: dict[str, Any]) -> str:
    """``older_proposer: draftmeta 9, vllm 0, none 5; hook: ...`` (what runs now)."""
    parts = []
    for path in _paths(report):
        rows = [r for r in report["builders"] if r["path"] == path]
        counts = ", ".join(f"{who} {sum(r['covered_by'] == who for r in rows)}"
                           for who in ("draftmeta", "vllm", "none"))
        parts.append(f"{path}: {counts}")
    return "covered: " + "; ".join(parts)


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
    if report["builders"]:
        lines[2:2] = textwrap.wrap(_summary(report), width)
    head = f"{'backend':<28} {'path':<15} {'covered by':<10} {'proven':<6} "
    lines.append(head + "reason")
    indent = " " * len(head)
    for row in report["builders"]:
        first = (f"{row['backend']:<28} {row['path']:<15} {row['covered_by']:<10} "
                 f"{row.get('proven', ''):<6} ")
        wrapped = textwrap.wrap(row["reason"], width - len(head), break_long_words=False,
                                break_on_hyphens=False) or [""]
        lines.append(first + wrapped[0])
        lines.extend(indent + more for more in wrapped[1:])
    proofs = sorted({row.get("proven", "") for row in report["builders"]} & PROOF.keys())
    if proofs:
        lines.append("")
        for proof in proofs:
            lines.extend(textwrap.wrap(f"proven {proof}: {PROOF[proof]}", width,
                                       subsequent_indent="  "))
    for path in _paths(report):
        said = report.get(f"{path}_engines")
        if said:
            lines.append("")
            lines.extend(textwrap.wrap(said[0].upper() + said[1:] + ".", width))
    if report["blocking_full_capture"]:
        blockers = ", ".join(report["blocking_full_capture"])
        lines.append("")
        lines.extend(textwrap.wrap(
            f"Without vLLM's or draftmeta's hook, these builders make the new runner rebuild "
            f"every group and keep the draft loop out of one captured graph: {blockers}", width))
    return "\n".join(line.rstrip() for line in lines)
