"""What a notebook calls from its cells.

``check_parameters`` (papermill's parameters against the notebook's own), ``headline`` (its result in one line,
marked for the reports' landing page) and ``token_scale_why`` (the reason a plasticity ranking is not the paper's,
where small tokens are it). Executing notebooks and rendering them is ``execute``'s, which reads the headlines this
module marks.
"""

from __future__ import annotations

import ast

from paperlib.records.names import PAPER_R

HEADLINE_MIME = "application/vnd.vit-plasticity.headline+json"
"""The MIME type of a notebook's headline output (``headline``), which the landing page reads."""


def headline(here: str, paper: str | None = None, why: str | None = None) -> None:
    """Show a notebook's result in one line, and mark it for the reports' landing page.

    The landing page is ``report.write_index``'s. ``here`` is what this run found, ``paper`` the paper's
    number for it, if any, and ``why``, where ``here`` contradicts ``paper``, the reason in one line."""
    text = f"Headline: {here}" + (f"  |  paper: {paper}" if paper else "") + (f"  |  why: {why}" if why else "")
    marked = {"here": here, "paper": paper} | ({"why": why} if why else {})
    import IPython.display  # when called: report imports this module, and sweep --plan needs no Jupyter

    IPython.display.display({HEADLINE_MIME: marked, "text/plain": text}, raw=True)


def token_scale_why(tau: float, token_rms: float) -> str | None:
    """``headline``'s ``why`` for a plasticity ranking that small tokens explain; None otherwise.

    Such a ranking is not the paper's (``tau``: Kendall's tau with it, below 1), of a model whose tokens are smaller
    than ViT-B/16's (``token_rms``, their RMS norm, below the paper's r); the ``why`` is notebook 02's scale curve."""
    if tau == 1 or token_rms >= PAPER_R:
        return None
    return (
        f"small tokens (RMS norm {token_rms:.1f}; ViT-B/16's: {PAPER_R}): a LayerNorm's rate falls as tokens grow "
        "and attention's rises, so small tokens favour the LayerNorms (notebook 02)"
    )


def check_parameters() -> None:
    """Stop a notebook that papermill gave a parameter it does not have (``-p lrr 0.1``).

    The names of papermill's injected cell (the executed cell that starts with "# Parameters") against those of the
    notebook's ``parameters`` cell (executed just before it), a ValueError naming the unknown ones and the valid ones.
    Called by the first cell after the parameters of every notebook; a notebook run without parameters (JupyterLab,
    nbval, papermill with none) has no injected cell: nothing to check."""
    import IPython  # when called, as in headline

    shell = IPython.get_ipython()
    history = shell.user_ns.get("In", []) if shell is not None else []
    injected = [i for i, source in enumerate(history) if i and source.lstrip().startswith("# Parameters")]
    if not injected:
        return
    given, declared = (_assigned(history[i]) for i in (injected[-1], injected[-1] - 1))
    unknown = sorted(given - declared)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)}; this notebook's parameters: {', '.join(sorted(declared))}"
        )


def _assigned(source: str) -> set[str]:
    """The names a cell assigns at its top level (``name = value``)."""
    tree = ast.parse(source)
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
