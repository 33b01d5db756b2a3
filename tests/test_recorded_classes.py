"""The recorded class lists: one file per release, nested records included, no silent fallback.

Where vLLM is not installed, specs are declared against stand-ins built from
``draftmeta/integrations/vllm/catalogue/recorded/vllm-<release>.json``. These tests hold that
those stand-ins give the same generated code and ``explain`` texts as vLLM's own classes, that
a release's lists are never replaced by another release's, and that a missing recording says
so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftmeta.fields import FieldKind, class_fields
from draftmeta.integrations.vllm.catalogue import classes as vllm_classes
from draftmeta.integrations.vllm.versions import release_of, supported
from tests.releases import stand_in_release

ROOT = Path(__file__).resolve().parents[1]

_RECORDED_EXPLAIN = """
import importlib.abc, json, sys

class _NoVllm(importlib.abc.MetaPathFinder):  # this process sees no vLLM at all
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _NoVllm())
from draftmeta.codegen import explain
from draftmeta.registry import SPECS, get_spec

print(json.dumps({name: explain(get_spec(name)) for name in SPECS}))
"""


def test_explain_texts_from_the_recorded_lists_alone_are_those_of_vllms_own_classes() -> None:
    pytest.importorskip("vllm", reason="compares with vLLM's own classes (needs vLLM)")
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, get_spec

    done = subprocess.run([sys.executable, "-c", _RECORDED_EXPLAIN], capture_output=True,
                          text=True, check=True, timeout=300, cwd=ROOT)
    recorded = json.loads(done.stdout)
    real = {name: explain(get_spec(name)) for name in SPECS}
    assert list(recorded) == list(real)
    assert [name for name in real if recorded[name] != real[name]] == []


@pytest.fixture
def recorded_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch folder of recorded lists in place of the shipped ones, release in use 0.32."""
    monkeypatch.setattr(vllm_classes, "RECORDED_DIR", tmp_path)
    monkeypatch.setattr(vllm_classes, "release_in_use", lambda: "0.32")
    monkeypatch.setenv("DRAFTMETA_VLLM_CLASSES", "recorded")
    vllm_classes._read_recorded.cache_clear()
    vllm_classes.load_metadata_class.cache_clear()
    yield tmp_path
    vllm_classes._read_recorded.cache_clear()
    vllm_classes.load_metadata_class.cache_clear()


def _write(folder: Path, release: str, classes: dict[str, list[list[str]]],
           borrowed: dict[str, str] | None = None) -> None:
    data: dict[str, object] = {"vllm": f"{release}.0", "classes": classes}
    if borrowed:
        data["borrowed"] = borrowed
    (folder / f"vllm-{release}.json").write_text(json.dumps(data))


def test_a_class_missing_from_the_release_in_use_is_not_read_from_another_release(
    recorded_dir: Path,
) -> None:
    _write(recorded_dir, "0.32", {})
    _write(recorded_dir, "0.33", {"pkg.mod:Sched": [["n", "int"]]})
    with pytest.raises(LookupError, match=r"pkg\.mod:Sched is not recorded in vllm-0\.32\.json"):
        vllm_classes._recorded("pkg.mod", "Sched")


def test_a_class_the_build_does_not_ship_is_read_from_the_release_its_file_names(
    recorded_dir: Path,
) -> None:
    _write(recorded_dir, "0.32", {}, borrowed={"pkg.mod:Sched": "0.33"})
    _write(recorded_dir, "0.33", {"pkg.mod:Sched": [["n", "int"]]})
    assert vllm_classes._recorded("pkg.mod", "Sched") == (("n", "int"),)


def test_a_release_without_recorded_lists_says_so(recorded_dir: Path) -> None:
    with pytest.raises(LookupError, match=r"no recorded class lists for vLLM 0\.32 "
                                          r"\(vllm-0\.32\.json is missing\): record them"):
        vllm_classes._recorded("pkg.mod", "Sched")


def test_a_recorded_field_naming_a_recorded_class_holds_that_classs_stand_in(
    recorded_dir: Path,
) -> None:
    _write(recorded_dir, "0.32", {
        "draftmeta_test_pkg.mod:Outer": [["inner", "draftmeta_test_pkg.mod.Outer.Inner | None"],
                                         ["other", "draftmeta_test_pkg.mod.Unrecorded | None"],
                                         ["n", "int"]],
        "draftmeta_test_pkg.mod:Outer.Inner": [["x", "torch.Tensor"]],
    })
    outer, imported = vllm_classes.load_metadata_class("draftmeta_test_pkg.mod", "Outer")
    assert not imported
    fields = {f.name: f for f in class_fields(outer)}
    assert fields["inner"].kind is FieldKind.RECORD and fields["inner"].optional
    record = fields["inner"].record
    assert record is not None and record.__qualname__ == "Outer.Inner"
    assert [f.name for f in class_fields(record)] == ["x"]
    assert fields["other"].kind is FieldKind.OBJECT  # not recorded: a text, as with vLLM
    assert fields["n"].kind is FieldKind.INT


def test_a_stand_in_release_without_a_recording_says_so_rather_than_borrowing(
    tmp_path: Path,
) -> None:
    vllm_classes._read_recorded.cache_clear()
    with stand_in_release(tmp_path) as version:
        message = rf"no recorded class lists for vLLM {version.replace('.', '[.]')}"
        with pytest.raises(LookupError, match=message):
            vllm_classes.recorded_lists(version)


def _shipped_lists() -> dict[str, dict[str, object]]:
    return {release_of(p.stem.removeprefix("vllm-")): json.loads(p.read_text())
            for p in sorted(vllm_classes.RECORDED_DIR.glob("vllm-*.json"))}


def test_every_recorded_file_is_of_a_supported_release_and_names_it() -> None:
    lists = _shipped_lists()
    assert set(lists) <= set(supported())
    for release, data in lists.items():
        assert release_of(str(data["vllm"])) == release


def test_every_recorded_file_records_the_nested_records_any_release_records() -> None:
    # a field whose annotation names a class recorded for some release must find that class
    # recorded (or borrowed) for its own release too, or its stand-in loses a nested record
    lists = _shipped_lists()
    known = {key.replace(":", ".") for data in lists.values()
             for key in data["classes"]}  # type: ignore[attr-defined]
    for release, data in lists.items():
        classes: dict[str, list[list[str]]] = data["classes"]  # type: ignore[assignment]
        have = {key.replace(":", ".") for key in (*classes, *data.get("borrowed", {}))}  # type: ignore[attr-defined]
        for key, fields in classes.items():
            for name, annotation in fields:
                for member in (m.strip() for m in annotation.split("|")):
                    assert member not in known or member in have, (release, key, name, member)


def test_every_borrowed_class_is_recorded_in_the_release_it_names() -> None:
    lists = _shipped_lists()
    for data in lists.values():
        for key, other in dict(data.get("borrowed", {})).items():  # type: ignore[call-overload]
            assert key in lists[other]["classes"], (key, other)  # type: ignore[operator]
