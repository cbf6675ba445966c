"""Sweep processes sharing one spec's runs: one process against two started together, paired, on the demo world.

    python -m benchmarks.sharing                 # 3 rounds on the 4-run demo spec
    python -m benchmarks.sharing --rounds 5

The spec is ``parameters/sweeps/plasticity_demo.yaml`` over ``DATASETS`` (the spec's three and a fourth: two runs
for each of two processes). A round times, each as a whole process on a results root of its own: one sweep
process, PyTorch's threads on every core; then two started together, each told it shares the cores with one
other (``VIT_PLASTICITY_WORKERS=2``: one thread each on 2 cores), as a user runs one per device. It prints both
wall times, their ratio and what each process's summary says it did (its runs done, those another process
finished), then the median ratio. A round first, not counted, fills the data caches and the imports' files.
Figures: docs/benchmarks.md ("Runs that share a machine or a folder").
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from paperlib.records import cli
from paperlib.speed import threads

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "parameters/sweeps/plasticity_demo.yaml"
DATASETS = ["digits", "digits_c/snow", "digits_c/contrast", "digits_c/gaussian_noise"]


def spec(folder: Path) -> Path:
    """The demo plasticity spec over ``DATASETS``, written into ``folder``."""
    text = yaml.safe_load(SPEC.read_text())
    text["notebook"] = str(ROOT / text["notebook"])
    text["grid"]["dataset"] = DATASETS
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def sweeps(spec_file: Path, root: Path, processes: int) -> tuple[float, list[str]]:
    """Wall seconds of ``processes`` sweep processes of ``spec_file`` started together, and each one's summary line.

    They share the results root ``root``; a process that fails raises a ValueError with its output."""
    root.mkdir(parents=True)
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(root / "results"), "VIT_PLASTICITY_REPORTS": str(root / "out")}
    if processes > 1:
        env[threads.WORKERS] = str(processes)
    command = [sys.executable, "-m", "paperlib", "sweep", str(spec_file)]
    logs = [root / f"process-{i}.txt" for i in range(processes)]
    start = time.perf_counter()
    outs = [log.open("w") for log in logs]
    running = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT) for out in outs]
    codes = [process.wait() for process in running]
    seconds = time.perf_counter() - start
    for out in outs:
        out.close()
    summaries = []
    for code, log in zip(codes, logs):
        said = log.read_text()
        if code:
            raise ValueError(f"a sweep process ended with {code}:\n{said[-2000:]}")
        summaries.append(re.search(r"^(\d+ done, \d+ finished by another process)", said, re.M)[1])
    return seconds, summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sharing", description=__doc__.split("\n")[0], formatter_class=cli.Help
    )
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds: one process, then two")
    args = parser.parse_args(argv)
    ratios = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        spec_file = spec(folder)
        sweeps(spec_file, folder / "warm-up", 1)
        for round_ in range(1, args.rounds + 1):
            one, _ = sweeps(spec_file, folder / f"one-{round_}", 1)
            two, summaries = sweeps(spec_file, folder / f"two-{round_}", 2)
            ratios.append(two / one)
            print(f"round {round_}: one process {one:.1f} s, two {two:.1f} s, {two / one:.2f}x; {'; '.join(summaries)}")
    print(f"two processes against one, median of {len(ratios)} rounds: {statistics.median(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
