"""A vLLM draft path is one declared object, in one module (issue 46, item 3: seams as data).

Each of vLLM's draft loops is declared once, as ``PATH`` in the module of
``draftmeta/integrations/vllm/plugin/paths/`` named after it; the plan finds the modules by
file name, and the plan, the plugin, its log line, ``draftmeta coverage`` and ``draftmeta
audit`` ask the declaration, never the name. A stand-in path added at run time (vLLM's next
draft loop: its hook called at every draft step, the first included) with a stand-in release
that names it is planned, installed, logged, reported and audited with nothing else changed; a
registry that does not read the folder leaves that release unplannable (the negative control).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from draftmeta.integrations.vllm.catalogue import releases
from draftmeta.integrations.vllm.plugin import paths as path_modules
from draftmeta.integrations.vllm.plugin import plan as plan_module
from draftmeta.integrations.vllm.plugin.plan import DraftPathKind, draft_path, draft_paths
from tests.releases import stand_in_release

NAME = "every_step"
"""The stand-in path's name, and its module's."""

STAND_IN_PATH = '''"""A stand-in draft path for the tests: vLLM's next draft loop, its hook
called at every draft step (the first included), declared in one module."""

from draftmeta.integrations.vllm.plugin.plan import Decision, DraftPathKind

NAME = "every_step"


def _decide(entry, release, cls, why, overrides):
    if cls is None:
        return Decision(entry, NAME, "none", f"{entry.builder.qualname} does not import here")
    return Decision(entry, NAME, "draftmeta", "the stand-in path's update at every step", cls)


def _install(decision, overrides, counters):
    def update_draft_decode_metadata(self, metadata):
        raise AssertionError("the stand-in path's replacement runs no draft step here")

    update_draft_decode_metadata.stand_in = decision.entry.name
    return {"update_draft_decode_metadata": update_draft_decode_metadata}


PATH = DraftPathKind(
    name=NAME,
    words="every step",
    needs=("update_draft_decode_metadata",),
    decide=_decide,
    install=_install,
    without_plugin=lambda entry: "none",
    engines="every_step rows covered by draftmeta apply to every engine (a stand-in)",
    captured=True,
    audited=True,
)
'''


@contextlib.contextmanager
def stand_in_path(folder: Path, source: str = STAND_IN_PATH) -> Iterator[str]:
    """One more path module, ``every_step.py`` in ``folder``, on the path package's module path
    for the duration; yields its name. The registry's cache is cleared on entry and on exit."""
    (folder / f"{NAME}.py").write_text(source)
    original = list(path_modules.__path__)
    path_modules.__path__.append(str(folder))
    importlib.invalidate_caches()
    draft_paths.cache_clear()
    try:
        yield NAME
    finally:
        path_modules.__path__[:] = original
        sys.modules.pop(f"{path_modules.__name__}.{NAME}", None)
        draft_paths.cache_clear()


def _modules() -> list[str]:
    folder = Path(path_modules.__file__).parent
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def test_the_declared_paths_are_the_modules_of_the_paths_package_each_named_after_its_path(
) -> None:
    declared = draft_paths()
    assert [p.name for p in declared] == _modules()
    assert {"hook", "older_proposer"} <= {p.name for p in declared}
    for path in declared:
        module = importlib.import_module(f"{path_modules.__name__}.{path.name}")
        assert module.PATH is path and draft_path(path.name) is path
        assert path.words and path.needs and path.engines


def test_every_release_names_only_declared_paths_in_its_paths_and_measurements() -> None:
    for r in releases():
        assert r.paths, r.version
        for name in r.paths:
            assert draft_path(name).name == name
        for entry in r.builders:
            for measured in entry.measured:
                assert measured.path in r.paths, (r.version, entry.name, measured.path)


def test_a_path_no_module_declares_is_refused_with_those_that_are() -> None:
    declared = ", ".join(p.name for p in draft_paths())
    assert "hook, older_proposer" in declared
    with pytest.raises(LookupError) as refused:
        draft_path(NAME)
    assert str(refused.value) == (f"draft path 'every_step', which no module of "
                                  f"{path_modules.__name__} declares (declared: {declared})")


@pytest.mark.parametrize(("source", "said"), [
    ("PATH = None\n", "declares no draft path"),
    (STAND_IN_PATH.replace('NAME = "every_step"', 'NAME = "elsewhere"'),
     "declares the draft path 'elsewhere': a path module is named after its path"),
], ids=["no-path", "misnamed"])
def test_a_path_module_that_declares_no_path_or_another_one_is_refused(
    tmp_path: Path, source: str, said: str
) -> None:
    with stand_in_path(tmp_path, source), pytest.raises(RuntimeError, match=said):
        draft_paths()


# -- a new path: one module, and its name in a release ------------------------------------------


@pytest.fixture
def new_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """The stand-in path module, and a stand-in release (the newest again, under the next
    number) whose only draft path it is; yields the release's first version and the path the
    module declares (imported here, not asked of the registry)."""
    pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")
    (tmp_path / "paths").mkdir()
    (tmp_path / "releases").mkdir()
    with stand_in_path(tmp_path / "paths") as name, \
            stand_in_release(tmp_path / "releases", paths=(name,)) as release:
        module = importlib.import_module(f"{path_modules.__name__}.{name}")
        yield f"{release}.0", module.PATH


def test_a_new_draft_path_is_planned_and_logged_from_its_module_alone(
    new_path: tuple[str, Any],
) -> None:
    from draftmeta.integrations.vllm.plugin.log import summary

    version, path = new_path
    plan = plan_module.make_plan(version)
    assert isinstance(path, DraftPathKind) and draft_path(NAME) is path
    assert plan.paths == (path,)
    assert {d.path for d in plan.decisions} == {NAME}
    assert all(plan.path_of(d) is path for d in plan.decisions)
    covered = [d.entry.name for d in plan.decisions if d.installs]
    assert "CPU_MLA" in covered  # its class imports here: the stand-in's decision covers it
    assert all(d.reason == "the stand-in path's update at every step"
               for d in plan.decisions if d.installs)
    line = summary(plan)
    assert (f"every step: {len(covered)} of {len(plan.decisions)} builders by draftmeta"
            in line), line
    assert "hook:" not in line and "older proposer:" not in line


def test_a_new_draft_path_is_installed_and_removed_by_the_plugin_from_its_module_alone(
    new_path: tuple[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm import plugin

    version, path = new_path
    plan = plan_module.make_plan(version)
    ours = [d for d in plan.decisions if d.installs]
    before = {d.cls: dict(vars(d.cls)) for d in ours}
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(plugin, "_installed_version", lambda: version)
    plugin.unregister()
    try:
        plugin.register()
        info = plugin.installed()
        assert info is not None and info.release == version.rsplit(".", 1)[0]
        assert info.patched == {NAME: tuple(d.entry.name for d in ours)}
        assert info.on(NAME) == info.patched[NAME]
        assert info.older_proposer == () and info.hook == ()
        for d in ours:
            replaced = vars(d.cls)["update_draft_decode_metadata"]
            assert replaced.stand_in == d.entry.name
        assert {p.path for p in plugin._plugin.builders} == {path}
        assert all(k.endswith(f"({NAME})") for k in info.skipped)
    finally:
        plugin.unregister()
    assert {d.cls: dict(vars(d.cls)) for d in ours} == before  # restored exactly


@pytest.mark.parametrize("active", [True, False], ids=["active", "inactive"])
def test_a_new_draft_path_is_reported_by_coverage_from_its_module_alone(
    new_path: tuple[str, Any], monkeypatch: pytest.MonkeyPatch, active: bool,
) -> None:
    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.tools import coverage as coverage_module

    version, path = new_path
    monkeypatch.setenv(plugin.DISABLE_ENV, "1" if active else "0")
    monkeypatch.setattr(coverage_module, "installed_version", lambda: version)
    report = coverage_module.coverage()
    assert report["plugin"]["active"] is active
    rows = report["builders"]
    assert rows and {r["path"] for r in rows} == {NAME}
    assert report[f"{NAME}_engines"] == path.engines
    assert report["hook_engines"] is None and report["older_proposer_engines"] is None
    covered = [r["backend"] for r in rows if r["with_plugin"] == "draftmeta"]
    assert covered and all(
        r["covered_by"] == ("draftmeta" if active else "none") for r in rows
        if r["backend"] in covered)
    # a captured path: whatever nobody covers keeps the loop out of one captured graph
    assert report["blocking_full_capture"] == [r["backend"] for r in rows
                                               if r["covered_by"] == "none"]
    text = coverage_module.coverage_table(report)
    assert f"covered: {NAME}: draftmeta {len(covered) if active else 0}," in text
    assert "Every_step rows covered by draftmeta apply to every engine" in " ".join(text.split())


def test_a_new_draft_path_that_calls_the_hook_is_what_the_audit_drives(
    new_path: tuple[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm import catalogue, versions
    from draftmeta.integrations.vllm.tools import audit_builders

    version, _ = new_path
    monkeypatch.setattr(versions, "installed_version", lambda: version)
    monkeypatch.setattr(catalogue, "installed_version", lambda: version)
    monkeypatch.setattr(audit_builders, "_registry_builders", dict)  # the catalogue's only
    plan = plan_module.make_plan(version)
    rows = audit_builders.hooked_builders(plugin=True)
    assert [r.name for r in rows if r.owner == "draftmeta"] == [
        d.entry.name for d in plan.decisions if d.installs]


# -- the negative control: a registry that does not read the folder ----------------------------


def test_a_registry_that_does_not_read_the_path_modules_leaves_the_new_release_unplannable(
    new_path: tuple[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm import plugin

    version, _ = new_path
    built_in = tuple(p for p in draft_paths() if p.name != NAME)
    monkeypatch.setattr(plan_module, "draft_paths", lambda: built_in)  # a fixed list
    with pytest.raises(plan_module.Unsupported, match=f"names draft path '{NAME}', which no "
                                                     "module of .* declares"):
        plan_module.make_plan(version)
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(plugin, "_installed_version", lambda: version)
    plugin.unregister()
    try:
        plugin.register()
        assert plugin.installed() is None  # fails closed: vLLM left untouched
    finally:
        plugin.unregister()
