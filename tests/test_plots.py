"""The bench plot is readable at the site's page width: its width is about the page's, every
font at least 10 pt, the measured batch sizes (not powers of two) as the x ticks, plain numbers
on the y axis (no ``6x10^1``), and the legend outside the panels.

The plot is drawn by ``draftmeta bench``'s own writer from a small stand-in result (nothing is
measured), and the figure is taken as it is saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftmeta.bench import BenchConfig, Sample, write_results

matplotlib = pytest.importorskip("matplotlib", reason="needs matplotlib (the bench extra)")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BATCHES = (1, 3, 40, 200)
PAGE_WIDTH_IN = 7.5
"""The widest a plot may be drawn: the site shows it at about 700 CSS pixels (7.3 in)."""
MIN_FONT_PT = 10.0


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The figure ``write_results`` saves for a stand-in CPU result of two backends."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    original = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    samples = [Sample(backend, path, batch, steps, host_us=(base * (1 + batch / 400),) * 3)
               for backend in ("CPU_MLA", "TRITON_MLA")
               for path, base in (("rebuild", 60.0), ("update", 6.0), ("advance", 20.0))
               for batch in BATCHES for steps in (2, 3)]
    paths = write_results(samples, BenchConfig(batch_sizes=BATCHES, steps=(2, 3), repeats=3),
                          tmp_path)
    assert paths["png"].stat().st_size > 10_000
    (figure,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure).draw()  # pyplot has closed it: a canvas of its own to measure on
    return figure


def _texts(figure: Any) -> list[Any]:
    from matplotlib.text import Text

    return [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_the_bench_plot_is_about_the_page_width_with_every_font_at_least_10_pt(
    saved: Any,
) -> None:
    width, height = saved.get_size_inches()
    assert width <= PAGE_WIDTH_IN and height <= width, (width, height)
    small = [(t.get_text(), t.get_fontsize()) for t in _texts(saved)
             if t.get_fontsize() < MIN_FONT_PT]
    assert not small, small


def test_the_bench_plot_ticks_are_the_measured_batch_sizes_and_plain_numbers(
    saved: Any,
) -> None:
    for ax in saved.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in BATCHES]
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        for label in labels:
            float(label)  # "6x10^1" is drawn as mathtext ($...$) and does not parse
        if ax is saved.axes[0]:
            assert len(labels) >= 3, labels


def test_the_bench_plots_legend_covers_no_data(saved: Any) -> None:
    renderer = saved.canvas.get_renderer()
    legends = saved.legends + [ax.get_legend() for ax in saved.axes if ax.get_legend()]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in saved.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
        assert {t.get_text() for t in legend.get_texts()} == {"rebuild", "update", "advance"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_committed_bench_plots_are_drawn_from_their_json_with_this_code(
    device: str, tmp_path: Path,
) -> None:
    from matplotlib.image import imread

    from draftmeta.bench.report import plot

    data = json.loads((ROOT / "benchmarks" / "results" / f"bench-{device}.json").read_text())
    drawn = plot(data["summary"], tmp_path / "plot.png", device, data.get("pairs"))
    for committed in (ROOT / "benchmarks" / "results" / f"bench-{device}.png",
                      ROOT / "docs" / "assets" / f"bench-{device}.png"):
        assert imread(committed).shape == imread(drawn).shape, committed


def _readable(figure: Any) -> None:
    """The checks every committed plot passes: page width, fonts, the legend off the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure).draw()
    renderer = figure.canvas.get_renderer()
    assert figure.get_size_inches()[0] <= PAGE_WIDTH_IN
    small = [(t.get_text(), t.get_fontsize()) for t in _texts(figure)
             if t.get_fontsize() < MIN_FONT_PT]
    assert not small, small
    assert figure.legends
    for legend in figure.legends:
        box = legend.get_window_extent(renderer)
        for ax in figure.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()


def _drawn(draw: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The figure ``draw()`` saves."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    original = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    draw()
    (figure,) = figures
    return figure


def _e2e_labels(data: Any) -> list[str]:
    """What the e2e plot's x axis must name: each timed configuration, by batch and K."""
    timed = [e for e in data["configurations"] if e["speedup"] is not None]
    several = len({(e["model"], e["backend"]) for e in timed}) > 1
    return [(f"{e['model']} {e['backend']}\n" if several else "")
            + f"b{e['batch_size']} K{e['k']}" + (" A/A" if e["aa"] else "") for e in timed]


def test_the_e2e_plot_is_readable_at_page_width_and_the_committed_one_is_its_drawing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One group per timed configuration of the committed JSON, and both committed PNGs are,
    pixel for pixel (within anti-aliasing noise), what this code draws from that JSON."""
    from draftmeta.integrations.vllm.tools.e2e.rendering import plot

    data = json.loads((RESULTS / "e2e-cpu.json").read_text())
    figure = _drawn(lambda: plot(data, tmp_path / "e2e.png"), monkeypatch)
    _readable(figure)
    ticks = [t.get_text() for t in figure.axes[-1].get_xticklabels()]
    assert ticks == _e2e_labels(data)
    for committed in (RESULTS / "e2e-cpu.png", ROOT / "docs" / "assets" / "e2e-cpu.png"):
        assert _rms(committed, tmp_path / "e2e.png") <= SAME_DRAWING_RMS, committed


def test_an_e2e_plot_drawn_from_other_figures_is_not_the_committed_one(tmp_path: Path) -> None:
    """The negative control of the test above: one pair ratio 0.05 higher is another drawing."""
    import copy

    from draftmeta.integrations.vllm.tools.e2e.rendering import plot

    data = copy.deepcopy(json.loads((RESULTS / "e2e-cpu.json").read_text()))
    timed = [e for e in data["configurations"] if e["speedup"] is not None]
    timed[0]["speedup"] = round(timed[0]["speedup"] + 0.05, 4)
    timed[0]["pair_speedups"] = [round(r + 0.05, 4) for r in timed[0]["pair_speedups"]]
    plot(data, tmp_path / "other.png")
    assert _rms(RESULTS / "e2e-cpu.png", tmp_path / "other.png") > SAME_DRAWING_RMS


def test_the_h200_draft_loop_plot_is_readable_at_page_width_with_the_measured_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from matplotlib.image import imread

    spec = importlib.util.spec_from_file_location("h200_plot",
                                                  ROOT / "benchmarks" / "h200" / "plot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = RESULTS / "draft-loop-h200.json"
    figure = _drawn(lambda: module.main(source, tmp_path / "h200.png"), monkeypatch)
    _readable(figure)
    batches = sorted({r["batch"] for r in json.loads(source.read_text())["draft_loop"]})
    assert [t.get_text() for t in figure.axes[-1].get_xticklabels()] == [str(b) for b in batches]
    for committed in (RESULTS / "draft-loop-h200.png",
                      ROOT / "docs" / "assets" / "draft-loop-h200.png"):
        assert imread(committed).shape == imread(tmp_path / "h200.png").shape, committed


SAME_DRAWING_RMS = 1.0
"""How far (root mean square over every pixel channel, on a 0-255 scale) a committed PNG may be
from this code's drawing of its JSON: anti-aliasing noise passes; one bar moved by 0.05 (about
3.2) does not."""


def _rms(committed: Path, drawn: Path) -> float:
    """The root-mean-square pixel difference of two PNGs on a 0-255 scale (inf if their sizes
    differ)."""
    import numpy as np
    from matplotlib.image import imread

    a, b = imread(committed), imread(drawn)
    if a.shape != b.shape:
        return float("inf")
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)) * 255)
