"""`make demo`'s machinery: papermill execution, HTML rendering, the index page."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import nbformat
import papermill
import pytest
import yaml

from paperlib.records import paths, storage
from paperlib.reports import execute
from paperlib.reports.notebook import HEADLINE_MIME, headline
from paperlib.speed import threads


def _figures(notebook) -> int:
    """How many PNG figures a notebook's outputs hold."""
    return sum("image/png" in output.get("data", {}) for cell in notebook.cells for output in cell.get("outputs", []))


def test_demo_report_of_one_notebook(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    monkeypatch.setenv("MPLBACKEND", "Agg")  # as `make` sets it: the report must still show its figures
    index = execute.run_demo(["00_components"], out_dir=tmp_path / "out")
    page = tmp_path / "out" / "00_components.html"
    assert index == tmp_path / "out" / "index.html"
    # quiet: one line for the notebook, with its time; the kernel talks over IPC, so ipykernel has no TCP warning
    out, err = capfd.readouterr()
    assert out.strip().startswith("00_components") and " s " in out and len(out.strip().splitlines()) == 1
    assert "without encryption" not in out + err
    # the landing page: the notebook's card with its section, thumbnail, headline beside the paper's, links
    landing = index.read_text()
    assert 'href="00_components.html"' in landing and 'href="00_components.nocode.html"' in landing
    assert "paper §2, appendix C.1 and C.3" in landing and 'src="thumbnails/00_components.png"' in landing
    assert "vit_base_in21k: MHA 33%" in landing and "paper: MHA, FC1, FC2 33% each" in landing
    assert "demo world (the notebook&#x27;s defaults)" in landing
    thumbnail = (tmp_path / "out" / "thumbnails" / "00_components.png").read_bytes()
    assert thumbnail[:8] == b"\x89PNG\r\n\x1a\n"
    # the reader's version has the outputs, not the code
    nocode = (tmp_path / "out" / "00_components.nocode.html").read_text()
    assert "Table 3 and Table 4" in nocode and "data:image/png;base64" in nocode
    assert "paper_models = " not in nocode and "paper_models" in page.read_text()
    html = page.read_text()
    assert "Table 3 and Table 4" in html and "data:image/png;base64" in html
    executed = nbformat.read(tmp_path / "out" / "00_components.ipynb", as_version=4)
    assert "papermill" in executed.metadata
    assert _figures(executed) == 3  # the block diagram, Tables 3 and 4, the demo datasets' samples
    # each figure as an image (the lab template has one PNG of its own)
    assert html.count("data:image/png;base64") >= 3 + 1
    # figures went to the reports folder of the environment, not into the repository
    assert (tmp_path / "reports" / "figures" / "00_block_diagram.png").is_file()
    assert not list((tmp_path / "out").glob(".*.partial.ipynb"))


def test_notebooks_run_one_per_core_each_with_its_figures(tmp_path, monkeypatch, capfd, write_notebook):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    figure = "import os, time\nimport matplotlib.pyplot as plt\nplt.plot([1, {}]); plt.show()\ntime.sleep(2)"
    notebooks = [write_notebook(tmp_path / f"0{i}_figure.ipynb", figure.format(i)) for i in range(3)]
    monkeypatch.setattr(paths, "notebook_paths", lambda names: notebooks)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    execute.run_demo(["given"], out_dir=tmp_path / "out")
    lines = capfd.readouterr().out.strip().splitlines()
    assert sorted(line.split()[0] for line in lines) == ["00_figure", "01_figure", "02_figure"]
    for notebook in notebooks:  # each kernel had the inline backend: setting it per notebook would race
        executed = nbformat.read(tmp_path / "out" / notebook.name, as_version=4)
        assert _figures(executed) == 1, notebook.name
    assert os.environ["MPLBACKEND"] == "Agg"  # and it is restored after


def test_notebooks_run_at_once_each_in_its_folder_leave_this_process_where_it_was(
    tmp_path, monkeypatch, write_notebook
):
    # papermill's `cwd` changes this process's folder for the run: two at once would leave it in a notebook's folder
    here = os.getcwd()
    monkeypatch.chdir(here)  # put back after, should this test fail
    monkeypatch.delenv("MPLBACKEND", raising=False)  # and the figure backend that two executes at once may leave set
    first, second = tmp_path / "first", tmp_path / "second"
    wait = "import os, pathlib, time\nwhile not pathlib.Path({!r}).exists():\n    time.sleep(0.05)\nprint(os.getcwd())"
    first.mkdir(), second.mkdir()
    a = write_notebook(
        first / "a.ipynb", f"open({str(tmp_path / 'a-began')!r}, 'w').close()", wait.format(str(tmp_path / "b-began"))
    )
    b = write_notebook(
        second / "b.ipynb", f"open({str(tmp_path / 'b-began')!r}, 'w').close()", wait.format(str(tmp_path / "a-ended"))
    )
    with ThreadPoolExecutor(2) as pool:  # a begins, then b; a ends, then b
        run_a = pool.submit(execute.execute, a, tmp_path / "a.out.ipynb")
        while not (tmp_path / "a-began").exists():
            assert not run_a.done(), run_a.result()
            time.sleep(0.05)
        run_b = pool.submit(execute.execute, b, tmp_path / "b.out.ipynb")
        run_a.result()
        (tmp_path / "a-ended").touch()
        run_b.result()
    assert os.getcwd() == here
    for folder, name in ((first, "a"), (second, "b")):
        cell = nbformat.read(tmp_path / f"{name}.out.ipynb", as_version=4).cells[-1]
        assert cell.outputs[0].text.strip() == str(folder)


def test_the_landing_page_comes_after_the_first_notebook_and_says_which_are_still_to_come(
    tmp_path, monkeypatch, write_notebook
):
    sources = [
        write_notebook(tmp_path / f"{name}.ipynb", "", heading=f"# {name[:2]} · {name[3:]} (paper §{i})")
        for i, name in enumerate(["00_first", "04_reads_runs", "02_second", "08_longest"])
    ]
    monkeypatch.setattr(paths, "notebook_paths", lambda names: sorted(sources))
    monkeypatch.setattr(threads, "cores", lambda: 1)
    out, events, landing = tmp_path / "out", [], {}

    def instant(notebook, output, parameters=None):  # as papermill's executed copy, at once
        landing[notebook.stem] = (out / "index.html").read_text() if (out / "index.html").is_file() else None
        events.append(notebook.stem)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(notebook.read_bytes())
        return output

    monkeypatch.setattr(execute, "execute", instant)
    monkeypatch.setattr(execute.pool, "demo_runs", lambda: events.append("demo sweeps"))
    index = execute.run_demo(out_dir=out)
    # the notebooks that read no demo run first (the longest of them, 08, before the others), then the demo sweeps,
    # then those that read them
    assert events == ["08_longest", "00_first", "02_second", "demo sweeps", "04_reads_runs"]
    assert "00 · first" in landing["00_first"] and landing["00_first"].count("not run yet") == 2  # from the start
    second = landing["02_second"]  # the page as the second notebook starts: the first one's report, the others' state
    assert 'href="00_first.nocode.html"' in second and "running" in second and "not run yet" in second
    assert second.index("00 · first") < second.index("02 · second") < second.index("04 · reads_runs")
    assert "2 notebook(s) still to come" in second and "http-equiv='refresh'" in second
    final = index.read_text()  # at the end: every report, nothing to come, no reloading
    assert all(f'href="{s.stem}.nocode.html"' in final for s in sources)
    assert "not run yet" not in final and "running" not in final and "refresh" not in final


def test_the_landing_page_says_what_the_demo_sweeps_run(tmp_path):
    page = execute.write_index(tmp_path).read_text()
    for name in execute.pool.DEMO_SWEEPS:
        given = yaml.safe_load((paths.PARAMETERS / "sweeps" / name).read_text())["parameters"]
        assert f"{name} " in page and f"runs of {given['steps']} steps of {given['batch_size']} images" in page
    assert "precision_demo.yaml 4 runs of 12 steps" in page


def test_a_failed_notebook_stops_those_not_started(tmp_path, monkeypatch, write_notebook):
    monkeypatch.setattr(threads, "cores", lambda: 1)
    failing = write_notebook(tmp_path / "00_fails.ipynb", "raise ValueError('on purpose')")
    after = write_notebook(tmp_path / "01_after.ipynb", f"open({str(tmp_path / 'ran')!r}, 'w').close()")
    monkeypatch.setattr(paths, "notebook_paths", lambda names: [failing, after])
    with pytest.raises(Exception, match="on purpose"):
        execute.run_demo(["given"], out_dir=tmp_path / "out")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out" / "01_after.ipynb").exists()


def test_progress_bars_show_their_last_state_in_the_reports(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("probe()")])
    bar = "\rprobing digits: {:3d}%|{}| {}/4"
    updates = [bar.format(25 * i, "#" * i + " " * (4 - i), i) for i in range(5)]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text=text) for text in updates + ["\n"]]
    nbformat.write(nb, tmp_path / "bar.ipynb")
    for page in (execute.render_html(tmp_path / "bar.ipynb"), tmp_path / "bar.nocode.html"):
        text = page.read_text()
        assert "probing digits: 100%|####| 4/4" in text and "probing digits:  25%" not in text


def test_a_notebook_waiting_for_a_lock_says_so_on_the_terminal_not_in_its_report(
    tmp_path, monkeypatch, capfd, write_notebook
):
    # the kernel sends its file descriptor 2 into the cells, as under `make demo` (ipykernel does not under pytest)
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    target = tmp_path / "result"
    code = f"from paperlib.records import storage\nwith storage.locked({str(target)!r}):\n    print('written')"
    notebook = write_notebook(tmp_path / "waits.ipynb", code)
    terminal = ""  # what this process's stderr, and the kernel's (inherited), received
    with ThreadPoolExecutor(1) as pool:
        with storage.locked(target):  # another process holds it, as a notebook beside it in `make demo`
            executed = pool.submit(execute.execute, notebook, tmp_path / "out.ipynb")
            deadline = time.monotonic() + 120
            while "waiting for another process" not in terminal:
                assert not executed.done() and time.monotonic() < deadline, "no notice of the wait on the terminal"
                time.sleep(0.1)
                terminal += capfd.readouterr().err
        executed.result()  # the kernel took the lock once it was let go
    assert paths.display(target) in terminal
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs
    assert [(output.name, output.text) for output in outputs] == [("stdout", "written\n")]


def test_a_notice_on_a_command_line_goes_to_stderr(capsys):
    storage.notice("waiting for another process that is writing results/x")
    assert capsys.readouterr() == ("", "waiting for another process that is writing results/x\n")


def test_landing_page_shows_parameters_and_missing_headlines(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 05 · Finetuning one component (paper §5.2)")])
    nb.metadata["papermill"] = {"parameters": {"dataset": "pets"}, "end_time": "2026-11-25T10:11:12.5"}
    nbformat.write(nb, out / "05_finetune.ipynb")
    (out / "05_finetune.html").write_text("<html></html>")
    (out / "sweep").mkdir()
    (out / "sweep" / "run.html").write_text("<html></html>")
    nbformat.write(nb, out / "sweep" / "run.ipynb")  # its page stands for it
    nbformat.write(nb, out / "sweep" / "bare.ipynb")  # a sweep run without HTML: its executed notebook
    landing = execute.write_index(out).read_text()
    assert "05 · Finetuning one component" in landing and "paper §5.2" in landing
    assert "parameters: dataset=pets · 2026-11-25 10:11" in landing and "no headline" in landing
    assert "<img" not in landing  # no figure, no thumbnail
    assert 'href="sweep/run.html"' in landing  # other reports listed below
    assert 'href="sweep/bare.ipynb"' in landing and 'href="sweep/run.ipynb"' not in landing


def test_a_headline_that_contradicts_the_paper_says_why_on_the_landing_page(tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data))
    headline("demo: LN1 > MHA", paper="MHA > LN1", why="small tokens")
    headline("vit_base: MHA 33%", paper="MHA 33%")
    assert "why: small tokens" in shown[0]["text/plain"]
    assert shown[1][HEADLINE_MIME] == {"here": "vit_base: MHA 33%", "paper": "MHA 33%"}  # no why: none marked
    out = tmp_path / "out"
    out.mkdir()
    for name, data in (("02_plasticity", shown[0]), ("00_components", shown[1])):
        output = nbformat.v4.new_output("display_data", data=data)
        nbformat.write(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[output])]), out / f"{name}.ipynb"
        )
        (out / f"{name}.html").write_text("<html></html>")
    landing = execute.write_index(out).read_text()
    assert 'paper: MHA &gt; LN1</p><p class="why">why they differ: small tokens</p>' in landing
    assert landing.count("why they differ") == 1


def test_parameters_reach_the_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    notebook = paths.notebook_paths(["00_components"])[0]
    out = execute.execute(
        notebook, tmp_path / "run.ipynb", {"paper_models": ["vit_large_in21k"], "images_per_dataset": 2}
    )
    text = out.read_text()
    assert "vit_large_patch16_224.orig_in21k" in text and "vit_huge_patch14_224" not in text


def test_a_finished_notebooks_kernel_is_shut_down_without_an_interrupt(tmp_path, monkeypatch, write_notebook, capfd):
    # jupyter_client interrupts a kernel (SIGINT) before it shuts it down; papermill shuts it down as soon as it has
    # answered its last request, and a SIGINT that came before ipykernel left that request's handler was logged on
    # the terminal of a successful run: "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel."
    import signal

    from jupyter_client import AsyncKernelManager

    sent, original = [], AsyncKernelManager._async_signal_kernel

    async def spy(self, signum):
        sent.append(signum)
        await original(self, signum)

    monkeypatch.setattr(AsyncKernelManager, "_async_signal_kernel", spy)
    notebook = write_notebook(tmp_path / "quiet.ipynb", "print('ok')", parameters="value = 1")
    for value in (1, 2):
        assert "ok" in execute.execute(notebook, tmp_path / f"{value}.ipynb", {"value": value}).read_text()
    assert signal.SIGINT not in sent
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_failed_execution_leaves_no_output(tmp_path, write_notebook):
    # a cell after the parameters fails (a committed notebook stopped by a parameter: tests/test_notebooks.py)
    notebook = write_notebook(
        tmp_path / "fails.ipynb", "print('started')", "raise ValueError(model)", parameters="model = 'demo'"
    )
    with pytest.raises(papermill.PapermillExecutionError, match="not_a_model"):
        execute.execute(notebook, tmp_path / "bad.ipynb", {"model": "not_a_model"})
    assert not (tmp_path / "bad.ipynb").exists() and not list(tmp_path.glob(".*.partial.ipynb"))


def test_notebooks_refreshed_in_place_keep_their_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = tmp_path / "figure.ipynb"
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()")]
    )
    nbformat.write(nb, notebook)
    execute.execute_inplace([notebook])
    assert _figures(nbformat.read(notebook, as_version=4)) == 1
    assert execute.os.environ["MPLBACKEND"] == "Agg"  # the caller's setting is back


def test_figures_are_named_by_their_parameters_and_written_whole(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paperlib.records import paths
    from paperlib.reports import plots

    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    path = plots.figure_path("05_finetune", "demo", "digits_c/snow", "mha", 0.03, "seed42")
    assert path == paths.figures_dir() / "05_finetune_demo_digits_c_snow_mha_0.03_seed42.png"
    assert plots.figure_path("x", "a", 1e-3) != plots.figure_path("x", "a", 3e-3)  # runs of a sweep get their own files
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    assert plots.save_figure(fig, path) == path
    # no temporary file left
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and list(path.parent.iterdir()) == [path]
    pdf = plots.save_figure(fig, tmp_path / "figure.pdf")  # the suffix's format, not the temporary file's
    assert pdf.read_bytes()[:4] == b"%PDF"
    plt.close(fig)


def test_robustness_boxes_show_one_dataset_and_count_divergence():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from paperlib.reports import plots

    runs = pd.DataFrame(
        {
            "dataset": ["a"] * 5,
            "component": ["mha", "mha", "mha", "ln1", "ln1"],
            "status": ["finished", "finished", "diverged", "finished", "finished"],
            "test_accuracy": [0.9, 0.8, float("nan"), 0.7, 0.6],
        }
    )
    fig, ax = plt.subplots()
    plots.config_boxes(runs, ax)
    assert [label.get_text() for label in ax.get_xticklabels()] == ["MHA\n1 diverged", "LN1"]
    with pytest.raises(ValueError, match="shows one dataset"):
        plots.config_boxes(pd.concat([runs, runs.assign(dataset="b")]), ax)
    plt.close(fig)
    # as the authors' Fig. 18: a diverged run's accuracy is in its box, full finetuning a dashed line at its mean
    runs.loc[2, "test_accuracy"] = 0.1
    full = pd.DataFrame({"dataset": "a", "component": "full", "status": "finished", "test_accuracy": [0.5, 0.7]})
    fig, ax = plt.subplots()
    plots.config_boxes(pd.concat([runs, full]), ax)
    assert len(ax.get_xticklabels()) == 2
    whiskers = [line.get_ydata() for line in ax.lines if line.get_linestyle() != "--" and len(line.get_ydata())]
    assert min(min(y) for y in whiskers) == pytest.approx(10.0)  # the diverged run's 10%
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == pytest.approx([60.0, 60.0])
    plt.close(fig)


def test_robustness_boxes_hide_outliers_and_linear_as_the_authors_unless_asked():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from paperlib.reports import plots

    # MHA's 12 runs: 11 near 90% and one at 20%, far beyond 1.5 IQR of the box: an outlier
    mha = [0.90, 0.91, 0.89, 0.90, 0.92, 0.88, 0.90, 0.91, 0.89, 0.90, 0.91, 0.20]
    runs = pd.DataFrame(
        {
            "dataset": "a",
            "component": ["mha"] * 12 + ["linear"] * 2,
            "status": "finished",
            "test_accuracy": mha + [0.5, 0.6],
        }
    )

    def drawn(**options):
        fig, ax = plt.subplots()
        plots.config_boxes(runs, ax, **options)
        labels = [label.get_text() for label in ax.get_xticklabels()]
        points = sorted(y for line in ax.lines if line.get_marker() not in ("None", None, "") for y in line.get_ydata())
        plt.close(fig)
        return labels, points

    assert drawn() == (["MHA"], [])  # the authors' boxes (seaborn's showfliers=False), no linear box
    labels, points = drawn(fliers=True, linear=True)
    assert labels == ["MHA", "Linear head (SGD)"]  # the drawing before: outliers and the linear box
    assert points == pytest.approx([20.0])
