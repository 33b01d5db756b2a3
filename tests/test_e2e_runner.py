"""The engine-pair runner, with engines made by hand: pairs swap their order of creation, a model
too large for two engines runs them one at a time, generates take turns, a GPU profile is taken
per side, negative controls run after their case on the right engine, and one case's failure
leaves the others running. The same runner serves the CPU and the GPU platform."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from e2e_fakes import generated

from draftmeta.integrations.vllm.tools.e2e import controls, runner
from draftmeta.integrations.vllm.tools.e2e.compare import Case
from draftmeta.integrations.vllm.tools.e2e.models import resolve
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape
from draftmeta.integrations.vllm.tools.e2e.platforms import CPU, CUDA, Platform


class _Recorder:
    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@attrs.define
class _Engine:
    """An engine stand-in: tok/s 200 with the plugin on, 100 off; the log says what ran."""

    settings: Any
    log: list[str]
    alive: list[_Engine]
    startup_seconds: float = 1.0
    shape: EngineShape = attrs.field(factory=lambda: EngineShape(False, ()))

    def generate(self, prompts: Any, max_tokens: int, recorder: Any, *, recording: bool,
                 profile: bool = False, around: Any = None) -> Any:
        assert self in self.alive, "an engine generated after it was freed"
        side = "on" if self.settings.plugin else "off"
        what = "recorded" if recording else "profiled" if profile else "timed"
        held = ""
        if around is not None:
            with around():
                held = " held"
        self.log.append(f"{side} b{len(prompts)} {what}{held}")
        rate = 200.0 if self.settings.plugin else 100.0
        return generated(tokens=[[5] * max_tokens for _ in prompts],
                         seconds=len(prompts) * max_tokens / rate, loops=4,
                         busy=0.01 if profile else None)


def _fake(monkeypatch: pytest.MonkeyPatch, platform: Platform, *, gib: float = 139.8,
          fail: str | None = None) -> tuple[Platform, list[str], list[int]]:
    log: list[str] = []
    alive: list[_Engine] = []
    most: list[int] = []

    @contextlib.contextmanager
    def open_engine(platform: Any, folder: Path, settings: Any, recorder: Any
                    ) -> Iterator[_Engine]:
        if fail is not None and settings.backend == fail:
            raise RuntimeError(f"{fail} does not build here")
        engine = _Engine(settings, log, alive)
        alive.append(engine)
        most.append(len(alive))
        log.append(f"start {'on' if settings.plugin else 'off'}"
                   + (" wrong spec" if settings.spec_overrides else ""))
        try:
            yield engine
        finally:
            alive.remove(engine)

    monkeypatch.setattr(runner, "open_engine", open_engine)
    monkeypatch.setattr(runner, "_weights", lambda *a: contextlib.nullcontext())
    # a held control's real injection patches the installed vLLM's older proposer, which vLLM
    # 0.34 no longer has: the runner's scheduling is what these tests read
    monkeypatch.setattr(controls, "injected", lambda name, first_index=2: contextlib.nullcontext())
    fake = attrs.evolve(platform, prepare=lambda: "0.0-test", recorder=_Recorder,
                        gpus=lambda: (1, gib))
    return fake, log, most


def _run(platform: Platform, cases: tuple[Case, ...], model: str = "tiny", **kwargs: Any
         ) -> tuple[runner.RunResult, list[int]]:
    seen: list[int] = []
    config = runner.RunConfig(platform=platform, models={model: resolve(model)}, cases=cases,
                              batch_sizes=(1, 2), max_tokens=4, warmups=1, repeats=2, **kwargs)
    with tempfile.TemporaryDirectory() as workdir:
        result = runner.run(config, workdir=Path(workdir),
                            checkpoint=lambda done, failed: seen.append(len(done)))
    return result, seen


@pytest.mark.parametrize(("model", "together"), [("tiny", True), ("v3-rank", False)])
def test_engine_pairs_swap_their_order_and_a_model_too_large_for_two_runs_one_at_a_time(
        monkeypatch: pytest.MonkeyPatch, model: str, together: bool) -> None:
    """Three pairs: off first, then on first, then off first; the tiny model's engines live side
    by side, v3-rank's (81 GiB) one at a time on an H200; every pair reaches the checkpoint."""
    platform, log, most = _fake(monkeypatch, CUDA)
    result, seen = _run(platform, (Case(model, "FLASHMLA", 3),), model=model, pairs=3)
    starts = [line for line in log if line.startswith("start")]
    assert starts == ["start off", "start on", "start on", "start off", "start off", "start on"]
    assert max(most) == (2 if together else 1)
    assert seen == [2, 2, 2]  # after each pair, one comparison per batch size
    one, two = result.comparisons
    assert one.pair_speedups == pytest.approx([2.0, 2.0, 2.0]) and one.speedup == 2.0
    assert len(one.measured("off")) == 6 and two.batch_size == 2
    assert one.strictly_identical


def test_generates_take_turns_after_the_recorded_ones_and_each_side_is_profiled_on_a_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    platform, log, _ = _fake(monkeypatch, CUDA)
    result, _ = _run(platform, (Case("tiny", "FLASHMLA", 3),))
    b1 = [line for line in log if " b1 " in line]
    assert b1 == ["off b1 recorded", "on b1 recorded", "off b1 timed", "on b1 timed",
                  "on b1 timed", "off b1 timed", "off b1 timed", "on b1 timed",
                  "off b1 profiled", "on b1 profiled"]
    comparison = result.comparisons[0]
    assert comparison.gpu_busy_ms_per_step("on") == pytest.approx(10 / 4)
    assert comparison.limit is not None


def test_the_cpu_platform_runs_the_same_pairs_without_a_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    platform, log, _ = _fake(monkeypatch, CPU)
    result, _ = _run(platform, (Case("tiny", "CPU_MLA", 3),))
    assert not any("profiled" in line for line in log)
    assert result.comparisons[0].limit is None and result.comparisons[0].speedup == 2.0


def test_a_held_control_runs_on_its_cases_plugin_on_engine_and_a_wrong_spec_on_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    platform, log, _ = _fake(monkeypatch, CPU)
    cases = (Case("tiny", "CPU_MLA", 3), Case("tiny", "CPU_MLA", 3, control="seq-lens"))
    result, _ = _run(platform, cases)
    assert [line for line in log if "held" in line] == ["on b1 recorded held",
                                                        "on b2 recorded held"]
    assert [line for line in log if line.startswith("start")] == ["start off", "start on"]
    controls = [c for c in result.comparisons if c.case.control]
    assert [c.batch_size for c in controls] == [1, 2]
    # compared with the case's own plugin-off recorded generate
    plain = [c for c in result.comparisons if not c.case.control]
    assert controls[0].reference is plain[0].reference

    platform, log, _ = _fake(monkeypatch, CUDA)
    cases = (Case("tiny", "FLASHMLA", 3), Case("tiny", "FLASHMLA", 3, control="stale-scheduler"))
    _run(platform, cases)
    assert [line for line in log if line.startswith("start")] == [
        "start off", "start on", "start on wrong spec"]


def test_one_failing_case_is_reported_and_the_others_still_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    platform, _, _ = _fake(monkeypatch, CUDA, fail="FLASH_ATTN_MLA")
    result, _ = _run(platform, (Case("tiny", "FLASH_ATTN_MLA", 3), Case("tiny", "FLASHMLA", 3)))
    (failure,) = result.failures
    assert failure.case.backend == "FLASH_ATTN_MLA"
    assert failure.error == "RuntimeError: FLASH_ATTN_MLA does not build here"
    assert {c.case.backend for c in result.comparisons} == {"FLASHMLA"}


def test_a_model_too_large_for_the_gpu_stops_the_run_with_the_sizes_before_any_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from draftmeta.integrations.vllm.tools.e2e.models import ModelProblem

    platform, log, _ = _fake(monkeypatch, CUDA, gib=79.2)
    with pytest.raises(ModelProblem, match=r"needs about 89 GiB per GPU.* this GPU has 79 GiB"):
        _run(platform, (Case("v3-rank", "FLASHMLA", 3),), model="v3-rank")
    assert log == []


def test_the_a_a_case_runs_both_engines_with_the_plugin_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    platform, log, _ = _fake(monkeypatch, CUDA)
    result, _ = _run(platform, (Case("tiny", "FLASHMLA", 3, aa=True),))
    assert [line for line in log if line.startswith("start")] == ["start off", "start off"]
    assert result.comparisons[0].speedup == 1.0


def test_a_config_that_cannot_run_is_refused_before_anything_starts() -> None:
    model = {"tiny": resolve("tiny")}
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        runner.RunConfig(platform=CPU, models=model, cases=(Case("tiny", "CPU_MLA", 3),),
                         batch_sizes=(1,), max_tokens=4, repeats=0)
    with pytest.raises(ValueError, match="K must be between 1 and 8"):
        runner.RunConfig(platform=CPU, models=model, cases=(Case("tiny", "CPU_MLA", 9),),
                         batch_sizes=(1,), max_tokens=4)
    with pytest.raises(ValueError, match="models the run does not have"):
        runner.RunConfig(platform=CPU, models=model, cases=(Case("large", "CPU_MLA", 3),),
                         batch_sizes=(1,), max_tokens=4)


class _Progress:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def step(self, kind: str, what: str) -> None:
        self.kinds.append(kind)

    def line(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


@pytest.mark.parametrize("platform", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_plan_is_every_unit_the_run_makes_and_none_for_a_backend_skipped_here(
        monkeypatch: pytest.MonkeyPatch, platform: Platform, tmp_path: Path) -> None:
    fake, _, _ = _fake(monkeypatch, platform)
    first = "CPU_MLA" if platform is CPU else "FLASHMLA"
    fake = attrs.evolve(fake, unavailable_reason=lambda b: "not here" if b == "SKIPPED" else None)
    cases = (Case("tiny", first, 3), Case("tiny", first, 3, control="seq-lens" if platform is CPU
                                          else "stale-scheduler"),
             Case("tiny", "SKIPPED", 3), Case("tiny", first, 2, aa=True))
    config = runner.RunConfig(platform=fake, models={"tiny": resolve("tiny")}, cases=cases,
                              batch_sizes=(1, 2), max_tokens=4, warmups=1, repeats=2, pairs=2)
    progress = _Progress()
    result = runner.run(config, workdir=tmp_path, progress=progress)  # type: ignore[arg-type]
    assert result.skipped == {"SKIPPED": "not here"}
    assert progress.kinds == runner.plan(config)


@pytest.mark.parametrize("backend", controls.SCHEDULED_BACKENDS)
def test_the_stale_scheduler_control_is_the_shipped_spec_with_only_its_schedule_left_unchanged(
        backend: str) -> None:
    """The factory the run hands the plugin for the ``stale-scheduler`` control, called as the
    plugin calls any override (:func:`~draftmeta.integrations.vllm.plugin.plan.spec_for`)."""
    pytest.importorskip("vllm")
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.plugin.plan import spec_for
    from draftmeta.rules import Unchanged

    entry = current_release().entry(backend)
    stale = spec_for(entry, {backend: controls.stale_scheduler_spec(backend)},
                     host_bound="frozen")
    shipped = entry.make_spec(host_bound="frozen")

    def unscheduled(rules: Any) -> dict[str, Any]:
        return {p: r for p, r in rules.items() if not p.startswith("decode.scheduler")}

    assert isinstance(stale.rules["decode.scheduler_metadata"], Unchanged)
    assert not isinstance(shipped.rules["decode.scheduler_metadata"], Unchanged)
    assert unscheduled(stale.rules) == unscheduled(shipped.rules)
    assert stale.name == f"{backend}.stale_scheduler"
