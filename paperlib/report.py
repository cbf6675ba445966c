"""Executing notebooks and rendering them as HTML reports.

    python -m paperlib.report demo                 # every notebook at demo scale -> reports/
    python -m paperlib.report demo -n 00_components
    python -m paperlib.report inplace notebooks/00_components.ipynb   # refresh committed outputs

``demo`` runs each notebook with papermill (its ``parameters`` cell defaults, or a YAML file of
``parameters/``) into ``reports/<notebook>.ipynb``, renders ``reports/<notebook>.html`` with
nbconvert and writes ``reports/index.html`` linking them all. ``inplace`` re-executes committed
notebooks with nbclient, so they keep their cells and metadata and nbval can check them.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import sys
import time
from pathlib import Path
from typing import Iterable

import nbformat

from . import cli, paths

KERNEL = "python3"
KERNELSPEC = {"name": KERNEL, "display_name": "Python 3 (ipykernel)", "language": "python"}


def notebook_paths(names: Iterable[str] | None = None) -> list[Path]:
    """The project's notebooks, in paper order, or those named (stem or file name)."""
    available = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return available
    by_stem = {p.stem: p for p in available}
    chosen = []
    for name in names:
        stem = Path(name).stem
        if stem not in by_stem:
            raise ValueError(f"unknown notebook {name!r}; valid notebooks: {', '.join(by_stem)}")
        chosen.append(by_stem[stem])
    return chosen


# the backend that puts figures into a notebook's outputs (ipykernel's default, unless the
# environment names another: ``make`` sets MPLBACKEND=Agg for the tests, under which ``plt.show()``
# shows nothing and the reports would have no figures)
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


@contextlib.contextmanager
def _inline_figures():
    """Kernels started inside get matplotlib's inline backend, whatever MPLBACKEND says outside."""
    previous = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = previous


def execute(notebook: Path, output: Path, parameters: dict | None = None, kernel_name: str = KERNEL) -> Path:
    """Run ``notebook`` with papermill, writing the executed copy to ``output`` (atomically);
    its figures are in its outputs (the inline backend)."""
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.stem}.partial.ipynb")
    try:
        with _inline_figures():
            papermill.execute_notebook(
                str(notebook),
                str(partial),
                parameters=parameters or {},
                kernel_name=kernel_name,
                cwd=str(notebook.parent),
                progress_bar=False,
            )
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    return output


def render_html(notebook: Path, output: Path | None = None) -> Path:
    """Render an executed notebook to a standalone HTML page (nbconvert, lab template)."""
    from nbconvert import HTMLExporter

    output = output or notebook.with_suffix(".html")
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nbformat.read(notebook, as_version=4))
    paths.atomic_write_text(output, body)
    return output


def _title(notebook: Path) -> str:
    """The first markdown heading of a notebook, or its file name."""
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return notebook.stem


def write_index(out_dir: Path) -> Path:
    """``index.html`` linking every HTML report under ``out_dir`` (sweep runs included)."""
    out_dir = Path(out_dir)
    output = out_dir / "index.html"
    pages = sorted(
        p
        for p in out_dir.rglob("*.html")
        if p != output and not any(part.startswith(".") for part in p.relative_to(out_dir).parts)
    )
    rows = []
    for page in pages:
        notebook = page.with_suffix(".ipynb")
        title = _title(notebook) if notebook.is_file() else page.stem
        link = page.relative_to(out_dir).as_posix()
        rows.append(f'<li><a href="{html.escape(link)}">{html.escape(link[:-5])}</a> &mdash; {html.escape(title)}</li>')
    text = (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>vit-plasticity reports</title></head>\n"
        "<body><h1>vit-plasticity reports</h1>\n"
        f"<p>Updated {time.strftime('%Y-%m-%d %H:%M')}. Demo-scale numbers are not the paper's.</p>\n"
        "<ul>\n" + "\n".join(rows) + "\n</ul>\n</body></html>\n"
    )
    paths.atomic_write_text(output, text)
    return output


def run_demo(names: Iterable[str] | None = None, out_dir: Path | None = None) -> Path:
    """Execute notebooks at demo scale and render their reports; returns the index page."""
    out_dir = out_dir or paths.reports_dir()
    for notebook in notebook_paths(names):
        start = time.perf_counter()
        print(f"executing {notebook.name} ...", flush=True)
        page = render_html(execute(notebook, out_dir / notebook.name))
        print(f"  -> {page} ({time.perf_counter() - start:.0f} s)", flush=True)
    return write_index(out_dir)


def execute_inplace(notebooks: Iterable[Path], timeout: int = 1800) -> None:
    """Re-execute committed notebooks in place with nbclient (no papermill metadata added; figures
    in the outputs, as ``execute``)."""
    from nbclient import NotebookClient

    for notebook in notebooks:
        notebook = Path(notebook)
        nb = nbformat.read(notebook, as_version=4)
        nb.metadata["kernelspec"] = KERNELSPEC
        with _inline_figures():
            NotebookClient(
                nb, timeout=timeout, kernel_name=KERNEL, resources={"metadata": {"path": str(notebook.parent)}}
            ).execute()
        paths.atomic_write_text(notebook, nbformat.writes(nb) + "\n")
        print(f"executed {notebook}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paperlib.report", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="execute notebooks at demo scale and render HTML reports")
    demo.add_argument("-n", "--notebook", action="append", help="only this notebook (repeatable)")
    demo.add_argument("--out", type=Path, default=None, help="report folder (default: reports/)")
    inplace = commands.add_parser("inplace", help="re-execute committed notebooks in place")
    inplace.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            index = run_demo(args.notebook, args.out)
            print(f"\nReports: {index.resolve()}")
        else:
            execute_inplace(args.notebooks)
    except (*cli.BAD_INPUT, nbformat.ValidationError) as error:  # an unknown notebook, a file missing or not one
        parser.exit(cli.fail(error))


if __name__ == "__main__":
    main(sys.argv[1:])
