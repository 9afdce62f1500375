"""The memory report as a PNG: drawn from the report's dict, written as every output, and a clear message without
matplotlib."""

import sys

import pytest
import torch
from test_report import _batch

from revnmt.memory.plot import plot_report, require_matplotlib
from revnmt.memory.report import memory_report
from revnmt.model import ModelConfig, build_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, width: int) -> None:
    """``path`` is a PNG image ``width`` pixels wide, as matplotlib reads it back."""
    image = pytest.importorskip("matplotlib.image")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[1] == width and pixels.shape[2] in (3, 4)


def test_a_report_without_a_budget_is_one_panel_of_bytes_against_length(tmp_path):
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="revgru", emb_dim=16, hidden_size=20, attention="emb", src_vocab=40, tgt_vocab=40)
    report = memory_report(build_model(cfg), [_batch(src_len=12, tgt_len=8), _batch(src_len=5, tgt_len=6, seed=1)])
    report["config"] = cfg.to_dict()
    path = tmp_path / "memory.png"
    path.write_text("an older picture")
    plot_report(report, path)
    assert_png(path, width=650)  # one panel, 6.5 inches at 100 dpi
    assert [p.name for p in tmp_path.iterdir()] == ["memory.png"]  # written atomically: no temporary left


def test_without_matplotlib_drawing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'revnmt\[plot\]'"):
        require_matplotlib()
