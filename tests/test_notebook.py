"""What the notebooks call from their cells (``paperlib.reports.notebook``); the headline's way to the landing
page is ``test_report.py``'s."""

import pytest

from paperlib.reports import notebook


def test_check_parameters_compares_papermills_cell_with_the_parameters_cell(monkeypatch):
    import IPython

    history = ["", "lr = 0.03  # peak\nseed = 0  # seed\n", "# Parameters\nlr = 0.1\n", "import paperlib\n"]
    shell = type("Shell", (), {"user_ns": {"In": history}})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    notebook.check_parameters()  # a parameter the notebook has
    history[2] = "# Parameters\nlrr = 0.1\nseed = 1\n"
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) lrr; this notebook's parameters: lr, seed"):
        notebook.check_parameters()
    del history[2]  # no papermill cell (JupyterLab, nbval): nothing to check
    notebook.check_parameters()


def test_a_ranking_not_the_papers_is_put_down_to_small_tokens_only_where_they_are():
    assert notebook.token_scale_why(1.0, 3.2) is None  # the paper's ranking: nothing to explain
    assert notebook.token_scale_why(-0.8, 25.0) is None  # tokens larger than ViT-B/16's (19.4): not the reason
    why = notebook.token_scale_why(-0.8, 3.24)
    assert "RMS norm 3.2" in why and "19.4" in why and "LayerNorm" in why
