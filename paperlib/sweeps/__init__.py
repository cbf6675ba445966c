"""Sweeps: a notebook over a parameter grid, planned before it runs (``python -m paperlib sweep``).

- ``plan``   what a sweep costs before it runs: its runs counted, the device-hours of those to run
- ``sweep``  papermill runs over a parameter grid, resumable, on CPUs, GPUs or SLURM
- ``spec_runs``  the runs of finetuning sweep specs for a notebook: run where missing when asked, read, checked
"""
