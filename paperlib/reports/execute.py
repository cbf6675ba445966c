"""Executing notebooks and rendering them as HTML reports.

    python -m paperlib report demo                 # every notebook at demo scale -> reports/
    python -m paperlib report demo -n 00_components
    python -m paperlib report inplace notebooks/00_components.ipynb   # refresh committed outputs

``demo`` runs each notebook with papermill (its ``parameters`` cell defaults, or a YAML file of
``parameters/``) into ``reports/<notebook>.ipynb``, renders ``reports/<notebook>.html`` with
nbconvert (and ``<notebook>.nocode.html``, the same without code cells, for readers) and writes
``reports/index.html``, the landing page (at once, then as each notebook starts and ends): per notebook its paper
section, a thumbnail of its first figure, its headline result (``notebook.headline``) beside the paper's, with why
they differ where they do, the parameters it ran with and when; or that it is running or not run yet.
``inplace`` re-executes committed notebooks with nbclient, so they keep their cells and metadata
and nbval can check them. What the notebooks call from their cells is ``notebook``'s. The notebook
libraries (nbformat, papermill, nbconvert, nbclient, traitlets; IPython in ``notebook``) are imported where
they are used: ``sweep`` imports this module, and its ``--dry-run`` and ``--plan`` render nothing, so they run
where Jupyter is not installed (a GPU node), and importing nbformat alone takes a second (jsonschema's format
checkers).
"""

from __future__ import annotations

import base64
import contextlib
import html
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Iterable

from paperlib.records import cli, commands, paths, storage
from paperlib.reports.notebook import HEADLINE_MIME
from paperlib.speed import threads
from paperlib.train import pool

KERNEL = "python3"
KERNELSPEC = {"name": KERNEL, "display_name": "Python 3 (ipykernel)", "language": "python"}


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


@contextlib.contextmanager
def ipc_kernels():
    """The configuration of kernels that talk to us over IPC sockets, not TCP, and end without an interrupt.

    The sockets are in a private temporary folder (removed after): nothing listens on the network, and
    ipykernel has no reason to warn that TCP traffic is unencrypted. The folder is absolute: the kernel
    runs in the notebook's folder. The kernels are shut down without an interrupt first (``_kernel_manager``)."""
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="kernel-") as folder:
        yield Config(
            {
                "KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "ipc")},
                "NotebookClient": {"kernel_manager_class": _kernel_manager()},
            }
        )


def _kernel_manager() -> type:
    """jupyter_client's kernel manager, except that it shuts a kernel down without interrupting it first.

    jupyter_client interrupts a kernel (SIGINT) before it asks it to shut down, in case it is still busy. Papermill
    shuts a kernel down as soon as the kernel has answered its last request (``kernel_info``, after the last cell),
    and ipykernel turns SIGINT into a KeyboardInterrupt until it has left the handler of a request: a SIGINT that
    arrived before it had, after a reply was sent, was logged as ``[IPKernelApp] ERROR | KeyboardInterrupt caught in
    kernel.`` on the terminal of a successful run (2 notebooks in 20). A kernel still busy (its notebook stopped from
    outside) is asked to shut down all the same, then terminated after ``shutdown_wait_time`` (5 s)."""
    from jupyter_client import AsyncKernelManager

    class KernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:  # an interrupt asked for, not one before a shutdown
                await super()._async_interrupt_kernel()

    return KernelManager


def execute(notebook: Path, output: Path, parameters: dict | None = None) -> Path:
    """Run ``notebook`` with papermill, writing the executed copy to ``output`` (atomically).

    Its figures are in its outputs (the inline backend)."""
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.stem}.partial.ipynb")
    try:
        with _inline_figures(), ipc_kernels() as config:
            papermill.execute_notebook(
                str(notebook),
                str(partial),
                parameters=parameters or {},
                kernel_name=KERNEL,
                # the kernel starts in the notebook's folder; papermill's `cwd` would change this
                # process's folder for the run, and two runs at once (run_demo) would leave it in one's
                resources={"metadata": {"path": str(notebook.parent)}},
                progress_bar=False,
                config=config,
            )
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    return output


def render_html(notebook: Path) -> Path:
    """Render an executed notebook to a standalone HTML page, ``<name>.html``, and one without code beside it.

    nbconvert with the lab template; the page without code, for readers, is ``<name>.nocode.html``
    (nbconvert's ``exclude_input``). A progress bar's updates (text overwritten after carriage
    returns) show as its last state, as JupyterLab shows them (nbconvert's
    ``CoalesceStreamsPreprocessor``)."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    output = notebook.with_suffix(".html")
    node = nbformat.read(notebook, as_version=4)
    for exclude_input, page in ((False, output), (True, output.with_suffix(".nocode.html"))):
        exporter = HTMLExporter(template_name="lab", exclude_input=exclude_input)
        exporter.register_preprocessor(CoalesceStreamsPreprocessor(), enabled=True)
        body, _ = exporter.from_notebook_node(node)
        storage.atomic_write_text(page, body)
    return output


def _title(notebook: Path, node=None) -> str:
    """The first markdown heading of a notebook (``node``: the notebook already read), or its file name."""
    import nbformat

    for cell in (node or nbformat.read(notebook, as_version=4)).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return notebook.stem


def _name_and_section(notebook: Path, node=None) -> tuple[str, str]:
    """A notebook's name and paper section, from its heading ("Finetuning results", "paper Tables 1 and 6; ...")."""
    name, _, section = _title(notebook, node).split("·", 1)[-1].strip().partition(" (")
    return name.strip(), section.rstrip(")").strip()


def summary(notebook: Path) -> dict:
    """What the landing page shows of an executed notebook.

    ``title`` and ``section`` (its heading, e.g. "Finetuning results" and "paper Tables 1 and 6; ..."), ``headline``
    (``{"here", "paper"}``, with ``"why"`` where given, or None), ``thumbnail`` (the first PNG figure, bytes, or None),
    ``parameters`` (those papermill gave it; {}: the notebook's defaults, the demo world) and ``date`` (when it
    finished, or None)."""
    import nbformat

    node = nbformat.read(notebook, as_version=4)
    name, section = _name_and_section(notebook, node)
    found = {"headline": None, "thumbnail": None}
    for cell in node.cells:
        for output in cell.get("outputs", []):  # only code cells have outputs
            data = output.get("data", {})
            if found["headline"] is None and HEADLINE_MIME in data:
                found["headline"] = dict(data[HEADLINE_MIME])
            if found["thumbnail"] is None and "image/png" in data:
                found["thumbnail"] = base64.b64decode(data["image/png"])
    papermill = node.metadata.get("papermill", {})
    end = papermill.get("end_time")
    return {
        "title": name,
        "section": section,
        **found,
        "parameters": dict(papermill.get("parameters") or {}),
        "date": end[:16].replace("T", " ") if end else None,
    }


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #212121; background: #fafafa; margin: 0 auto; max-width: 1180px; padding: 24px; }
h1 { font-weight: 600; margin-bottom: 4px; } .lead { color: #616161; margin-top: 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: 16px; }
.card { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 14px; }
.card h2 { font-size: 1.05em; margin: 0 0 2px 0; } .section { color: #757575; font-size: 0.85em; margin: 0 0 8px 0; }
.card img { width: 100%; height: 190px; object-fit: contain; background: #fff; border: 1px solid #eee; }
.here, .paper, .why { font-size: 0.9em; margin: 6px 0 0 0; } .paper { color: #1565c0; }
.why { color: #616161; font-style: italic; } .pending { color: #9e9e9e; }
.meta { color: #757575; font-size: 0.8em; margin-top: 8px; } a { color: #1976d2; text-decoration: none; }
a:hover { text-decoration: underline; } .links { margin-top: 8px; font-size: 0.9em; }
"""


def _card(notebook: Path, out_dir: Path) -> str:
    """One notebook's card on the landing page; its thumbnail is written to ``thumbnails/``."""
    info = summary(notebook)
    page = notebook.with_suffix(".html").relative_to(out_dir).as_posix()
    nocode = notebook.with_suffix(".nocode.html").relative_to(out_dir).as_posix()
    image = ""
    if info["thumbnail"] is not None:
        thumb = out_dir / "thumbnails" / f"{notebook.stem}.png"
        storage.atomic_write(thumb, lambda tmp: Path(tmp).write_bytes(info["thumbnail"]))
        source = html.escape(f"thumbnails/{thumb.name}")
        image = f'<a href="{html.escape(nocode)}"><img src="{source}" alt="main figure"></a>'
    line = info["headline"] or {}
    here = html.escape(line.get("here") or "no headline (run the notebook to the end)")
    paper = f'<p class="paper">paper: {html.escape(line["paper"])}</p>' if line.get("paper") else ""
    why = f'<p class="why">why they differ: {html.escape(line["why"])}</p>' if line.get("why") else ""
    given = ", ".join(f"{k}={v}" for k, v in info["parameters"].items())
    ran = f"parameters: {given}" if given else "demo world (the notebook's defaults)"
    when = f" · {info['date']}" if info["date"] else ""
    return (
        f'<div class="card"><h2>{html.escape(notebook.stem[:2])} · {html.escape(info["title"])}</h2>'
        f'<p class="section">{html.escape(info["section"])}</p>{image}'
        f'<p class="here"><b>here:</b> {here}</p>{paper}{why}'
        f'<p class="meta">{html.escape(ran)}{html.escape(when)}</p>'
        f'<p class="links"><a href="{html.escape(nocode)}">report</a> · '
        f'<a href="{html.escape(page)}">with code</a></p></div>'
    )


def _pending_card(notebook: Path, state: str) -> str:
    """The card of a notebook whose report is not made yet: its name and section, and ``state``."""
    name, section = _name_and_section(notebook)
    return (
        f'<div class="card"><h2>{html.escape(notebook.stem[:2])} · {html.escape(name)}</h2>'
        f'<p class="section">{html.escape(section)}</p><p class="here pending">{html.escape(state)}</p></div>'
    )


def write_index(out_dir: Path, pending: dict[Path, str] | None = None) -> Path:
    """``index.html``, the landing page of the reports in ``out_dir``.

    A card per notebook report in ``out_dir`` (``_card``), then a list of every other report under it (sweep runs):
    its HTML page, or its executed notebook where it has none (a sweep renders HTML only if asked). ``pending``: the
    notebooks (source files) whose reports are being made, each with its state ("running", "not run yet"), shown in
    place of any earlier report; while there are any, the page reloads itself every 15 s."""
    out_dir = Path(out_dir)
    output = out_dir / "index.html"
    pending = pending or {}
    notebooks = sorted(out_dir.glob("[0-9][0-9]_*.ipynb"))
    cards = {notebook.stem: _pending_card(notebook, state) for notebook, state in pending.items()}
    cards |= {n.stem: _card(n, out_dir) for n in notebooks if n.with_suffix(".html").is_file() and n.stem not in cards}
    shown = {n.with_suffix(suffix) for n in notebooks for suffix in (".html", ".nocode.html", ".ipynb")}
    others = sorted(
        p
        for p in [*out_dir.rglob("*.html"), *out_dir.rglob("*.ipynb")]
        if p != output
        and p not in shown
        and not (p.suffix == ".ipynb" and p.with_suffix(".html").is_file())
        and not any(part.startswith(".") for part in p.relative_to(out_dir).parts)
    )
    rows = []
    for page in others:
        notebook = page.with_suffix(".ipynb")
        title = _title(notebook) if notebook.is_file() else page.stem
        link = page.relative_to(out_dir).as_posix()
        label = link.removesuffix(page.suffix)
        rows.append(f'<li><a href="{html.escape(link)}">{html.escape(label)}</a> &mdash; {html.escape(title)}</li>')
    coming = f"{len(pending)} notebook(s) still to come: this page updates as each finishes. " if pending else ""
    text = (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>vit-plasticity reports</title>"
        + ("<meta http-equiv='refresh' content='15'>" if pending else "")
        + f"<style>{STYLE}</style></head>\n<body><h1>vit-plasticity reports</h1>\n"
        '<p class="lead">"Vision Transformer Finetuning Benefits from Non-Smooth Components" (ICML 2026), '
        f"reproduced notebook by notebook. Page written {time.strftime('%Y-%m-%d %H:%M:%S')}. {coming}"
        "Demo-world numbers come from a 0.3M-parameter ViT on 32-pixel digits: they are not the paper's. "
        f"{html.escape(pool.demo_settings())}</p>\n"
        '<div class="grid">\n'
        + "\n".join(cards[stem] for stem in sorted(cards))
        + "\n</div>\n"
        + (("<h2>Other reports</h2>\n<ul>\n" + "\n".join(rows) + "\n</ul>\n") if rows else "")
        + "</body></html>\n"
    )
    storage.atomic_write_text(output, text)
    return output


READ_DEMO_SWEEPS = ("04", "05", "06", "07", "09", "10", "11")
"""The notebooks (by number) that read the runs of the demo pool (``pool.demo_runs``): ``run_demo`` runs them after."""

LONGEST_FIRST = ("08",)
"""Of the notebooks that read no demo run, the one that takes longest (08 finetunes its own ViT): ``run_demo`` starts
it first, so that the others run beside it and the cores finish together before the sweeps."""


def run_demo(names: Iterable[str] | None = None, out_dir: Path | None = None) -> Path:
    """Execute notebooks at demo scale and render their reports; returns the index page.

    It prints one line per notebook with the time it took. The notebooks that read no demo run come first, so that
    their reports come within a minute. Every notebook at once (no ``names``): then the demo sweeps' missing runs and
    the probes two notebooks share, in one pool of processes, one per core (``pool.demo_runs``), so that the
    notebooks that read them (``READ_DEMO_SWEEPS``) find them made instead of running each its part one after another
    or waiting on another's lock; then those notebooks. The notebooks run one per core at a time: much of a
    notebook's time is its kernel starting and importing, on one core. Their kernels keep PyTorch's own threads, so
    their results are those of one notebook run alone; what two notebooks share on disk is locked
    (``storage.locked``). The landing page (``write_index``) is written at once and again as each notebook starts and
    ends; a notebook not run yet says so on it."""
    out_dir = out_dir or paths.reports_dir()
    notebooks = paths.notebook_paths(names)
    pending = dict.fromkeys(notebooks, "not run yet")
    changed = threading.Lock()  # the pending notebooks, and the page that shows them

    def update_page(notebook: Path | None = None, state: str | None = None) -> Path:
        with changed:
            if state is not None:
                pending[notebook] = state
            elif notebook is not None:
                del pending[notebook]
            return write_index(out_dir, pending)

    failed = threading.Event()  # once a notebook fails, those not started yet are not started

    def report(notebook: Path) -> tuple[Path, Path, float] | None:
        if failed.is_set():
            return None
        update_page(notebook, "running")
        start = time.perf_counter()
        try:
            page = render_html(execute(notebook, out_dir / notebook.name))
        except BaseException:
            failed.set()
            update_page(notebook, "failed: see the terminal")
            raise
        update_page(notebook)
        return notebook, page, time.perf_counter() - start

    def report_each(chosen: list[Path]) -> None:
        with ThreadPoolExecutor(max(1, min(threads.cores(), len(chosen)))) as pool:
            for done in as_completed([pool.submit(report, notebook) for notebook in chosen]):
                if (result := done.result()) is not None:
                    notebook, page, seconds = result
                    print(f"{notebook.stem:<28} {seconds:5.0f} s  {paths.display(page)}", flush=True)

    update_page()
    # the inline backend for every kernel, set once: each execute's own setting and restoring would race
    with _inline_figures():
        first = [notebook for notebook in notebooks if notebook.stem[:2] not in READ_DEMO_SWEEPS]
        report_each(sorted(first, key=lambda notebook: notebook.stem[:2] not in LONGEST_FIRST))
        if not names:
            start = time.perf_counter()
            pool.demo_runs()
            print(f"{'demo sweeps':<28} {time.perf_counter() - start:5.0f} s", flush=True)
        report_each([notebook for notebook in notebooks if notebook.stem[:2] in READ_DEMO_SWEEPS])
    return update_page()


def execute_inplace(notebooks: Iterable[Path]) -> None:
    """Re-execute committed notebooks in place with nbclient.

    No papermill metadata is added; figures are in the outputs, as ``execute``'s. A cell may run for 30 minutes."""
    import nbformat
    from nbclient import NotebookClient

    for notebook in notebooks:
        nb = nbformat.read(notebook, as_version=4)
        nb.metadata["kernelspec"] = KERNELSPEC
        with _inline_figures(), ipc_kernels() as config:
            NotebookClient(
                nb,
                timeout=1800,
                kernel_name=KERNEL,
                resources={"metadata": {"path": str(notebook.parent)}},
                config=config,
            ).execute()
        storage.atomic_write_text(notebook, nbformat.writes(nb) + "\n")
        print(f"executed {notebook}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m paperlib report``: the demo's reports (``demo``), or notebooks re-executed in place."""
    import nbformat

    parser = commands.report()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            index = run_demo(args.notebook, args.out)
            print(f"\nReports: {index.resolve()}")
        else:
            execute_inplace(args.notebooks)
    except (*cli.BAD_INPUT, nbformat.ValidationError) as error:  # an unknown notebook, a file missing or not one
        parser.exit(cli.fail(error))
