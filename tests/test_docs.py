"""Every Python example in README.md and docs/ runs.

Each ```python block is one test, named by its file and block index
(``docs/guide.md::block-3``). The blocks of one file run in order in one shared namespace, so a
block may use what earlier ones defined; running a single block runs the earlier blocks of its
file first. A block preceded by the HTML comment ``<!-- needs-cuda -->`` runs only where CUDA
is available (the CUDA-graph examples), one preceded by ``<!-- needs-vllm -->`` only where vLLM
is installed (examples that build metadata with vLLM's real builders).
"""

from __future__ import annotations

import fnmatch
import re
import sys
import types
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CUDA_MARKER = "<!-- needs-cuda -->"
VLLM_MARKER = "<!-- needs-vllm -->"


def _missing(marker: str) -> str | None:
    """Why a block behind ``marker`` cannot run here, or ``None`` if it can."""
    if marker == CUDA_MARKER:
        return None if torch.cuda.is_available() else "needs CUDA"
    import importlib.util

    return None if importlib.util.find_spec("vllm") is not None else "needs vLLM"
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


class Block(NamedTuple):
    """One ```python block: its index in the file, first code line, source, and the marker in
    front of it (what it needs), if any."""

    index: int
    line: int
    source: str
    needs: str | None


def python_blocks(text: str) -> list[Block]:
    """Every ```python (or ```py) block of a Markdown text, in order."""
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        words = match.group("info").strip().split()
        if not words or words[0].lstrip(".{").rstrip("}") not in ("python", "py"):
            continue
        before = text[: match.start()].rstrip()
        needs = next((m for m in (CUDA_MARKER, VLLM_MARKER) if before.endswith(m)), None)
        indent = match.group("indent")
        source = "".join(
            line[len(indent):] if line.startswith(indent) else line
            for line in match.group("body").splitlines(keepends=True)
        )
        line = text.count("\n", 0, match.start()) + 2
        blocks.append(Block(len(blocks), line, source, needs))
    return blocks


def _documents() -> list[Path]:
    readme = ROOT / "README.md"
    return ([readme] if readme.exists() else []) + sorted((ROOT / "docs").glob("**/*.md"))


def _cases() -> list[object]:
    cases: list[object] = []
    for path in _documents():
        name = path.relative_to(ROOT).as_posix()
        for block in python_blocks(path.read_text(encoding="utf-8")):
            cases.append(pytest.param(name, block.index, id=f"{name}::block-{block.index}"))
    return cases


class _FileRun:
    """The shared namespace of one file's blocks and how far they have run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.blocks = python_blocks((ROOT / name).read_text(encoding="utf-8"))
        # a real module, so dataclasses and typing.get_type_hints find the examples' classes
        module = types.ModuleType("docs_example_" + re.sub(r"\W", "_", name))
        sys.modules[module.__name__] = module
        self.namespace = module.__dict__
        self.done = 0
        self.failed: int | None = None

    def run_through(self, index: int) -> None:
        while self.done <= index:
            block = self.blocks[self.done]
            self.done += 1
            if block.needs is not None and _missing(block.needs):
                continue
            if self.failed is not None:
                raise AssertionError(
                    f"{self.name}: block {block.index} not run, block {self.failed} failed"
                )
            # blank lines in front, so tracebacks give the Markdown file's line numbers
            code = compile(
                "\n" * (block.line - 1) + block.source,
                f"{self.name} (python block {block.index})",
                "exec",
                dont_inherit=True,  # not this file's `from __future__ import annotations`
            )
            try:
                exec(code, self.namespace)
            except BaseException:
                self.failed = block.index
                raise


_runs: dict[str, _FileRun] = {}


@pytest.mark.parametrize(("name", "index"), _cases())
def test_example_runs(name: str, index: int) -> None:
    run = _runs.setdefault(name, _FileRun(name))
    needs = run.blocks[index].needs
    why = _missing(needs) if needs is not None else None
    if why is not None:
        pytest.skip(f"{name} block {index} {why}")
    run.run_through(index)


def test_blocks_are_extracted() -> None:
    """Python blocks are found (indented ones too), other languages ignored, the marker seen."""
    text = (
        "text\n\n```python\nx = 1\n```\n\n<!-- needs-cuda -->\n```python\nraise SystemExit\n```\n\n"
        "```bash\nls\n```\n\n- item\n\n    ```python\n    y = x + 1\n    ```\n"
        "\n<!-- needs-vllm -->\n```python\nimport vllm\n```\n"
    )
    blocks = python_blocks(text)
    assert [(b.index, b.source, b.needs) for b in blocks] == [
        (0, "x = 1\n", None),
        (1, "raise SystemExit\n", CUDA_MARKER),
        (2, "y = x + 1\n", None),
        (3, "import vllm\n", VLLM_MARKER),
    ]
    assert blocks[0].line == 4  # the line of `x = 1`


def test_the_generated_source_shown_on_the_example_page_is_what_its_example_prints() -> None:
    """The example page's printed function is what ``python example.py`` prints: the example
    runs as ``__main__``, so the class shows as ``__main__.DecodeMetadata``, not a test's name."""
    import contextlib
    import io

    text = (ROOT / "docs" / "example.md").read_text()
    marker = text.index("`explain(spec)` (or `draftmeta explain TRITON_MLA`")
    code_start = text.rindex("```python", 0, marker) + len("```python")
    code = text[code_start:text.index("```", code_start)]
    shown_start = text.index("```text", marker) + len("```text\n")
    shown = text[shown_start:text.index("```", shown_start)]
    module = types.ModuleType("__main__")
    main = sys.modules["__main__"]
    sys.modules["__main__"] = module  # dataclasses look their module up
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "example.py", "exec", dont_inherit=True), module.__dict__)
    finally:
        sys.modules["__main__"] = main
    assert printed.getvalue() == shown, (
        "docs/example.md's generated source is stale: paste what its example prints")
    assert "docs_example" not in shown and "_readme_" not in shown


def documented_layout(text: str) -> dict[str, bool]:
    """The package tree of the API reference's "Package layout" section: ``{path: is_folder}``,
    paths relative to the repository root, read from the indentation (two spaces a level)."""
    section = text[text.index("## Package layout"):]
    start = section.index("```text\n") + len("```text\n")
    tree = section[start:section.index("```", start)]
    paths: dict[str, bool] = {}
    parents: list[str] = []
    for line in tree.splitlines():
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip(" "))) // 2
        assert depth <= len(parents), f"{line!r} is indented under a file"
        del parents[depth:]
        path = "/".join([*parents, name.rstrip("/")])
        paths[path] = name.endswith("/")
        if name.endswith("/"):
            parents.append(name.rstrip("/"))
    return paths


def undocumented_and_unmatched(documented: dict[str, bool], modules: set[str]
                               ) -> tuple[list[str], list[str]]:
    """The modules no documented file names, and the documented files that name no module. A
    documented name may be a pattern (``v0_*.py``: one catalogue module per release), so adding
    a release module changes nothing here."""
    files = [p for p, folder in documented.items() if not folder]
    undocumented = sorted(m for m in modules if not any(fnmatch.fnmatchcase(m, f) for f in files))
    unmatched = [f for f in files if not any(fnmatch.fnmatchcase(m, f) for m in modules)]
    return undocumented, unmatched


def test_the_package_layout_in_the_api_reference_names_every_module_and_no_other() -> None:
    documented = documented_layout((ROOT / "docs" / "reference" / "index.md").read_text())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "draftmeta").rglob("*.py")}
    assert undocumented_and_unmatched(documented, modules) == ([], [])
    assert [p for p, folder in documented.items() if folder and not (ROOT / p).is_dir()] == []


def test_a_module_missing_from_the_layout_or_a_stale_entry_is_reported() -> None:
    # negative control for the check above, on a made-up tree
    documented = {"pkg/a.py": False, "pkg/gone.py": False, "pkg/cat/v0_*.py": False}
    modules = {"pkg/a.py", "pkg/new.py", "pkg/cat/v0_33.py", "pkg/cat/v0_35.py"}
    assert undocumented_and_unmatched(documented, modules) == (["pkg/new.py"], ["pkg/gone.py"])
