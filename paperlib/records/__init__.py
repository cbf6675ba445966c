"""Records: what a saved result is, where it lives and how it is read back, without torch.

The bottom layer: every other package builds on it, and it imports none of them (``docs/architecture.md``).

- ``paths``         where things live: the repository, results, reports, data caches, custom models and datasets
- ``storage``       atomic writes with checksums, checked reads and the lock of what one process at a time writes
- ``cli``           the command lines' parameter files, overrides and ``--help``
- ``commands``      every command's command line, parsed before the command's module (and torch) is imported
- ``names``         the names every table and figure shares: components, configurations, labels, the choices a
                    result records
- ``step_options``  how a run's steps may run (precision, compilation, attention kernel, fused ops) and speed presets
- ``specs``         sweep specs: read, checked, expanded into their runs' parameters
- ``methods``       how a run trains its component (``Method``: weights, LoRA, a subset), in one registry
- ``readings``      what a run saw, image by image, and every accuracy and checkpoint read from it
- ``runs``          what a finetuning run is (``Run``), its folder, its record and whether it is finished
- ``runs_table``    every finetuning run as a table: a results root's, a spec's (``for_spec``), their histories
- ``measurements``  what a plasticity measurement is (``Measurement``), its folder, its record and whether it is current
- ``probe_tables``  a linear probe's table on disk (``probe.csv``, ``metadata.json``) and its probe points
"""
