"""Training: the paper's finetuning protocol (§5.2), one run top to bottom, and the demo ViT's pretraining.

- ``config``       ``Config``: a run checked against the training stack when it is made
- ``checkpoints``  a run's checkpoint while it trains, its record when it ends, and its kept model (``load_model``)
- ``paper_step``   the paper's step, as the authors' loop takes it (a run asking for nothing beyond the paper)
- ``step``         what a run trains with (``build_step``): its model adapted and its step, also what is timed
- ``evaluation``   what a run sees at a validation: each split image by image, the authors' NaN model scored
- ``finetune``     the protocol, top to bottom; the ``finetune`` command
- ``pool``         the runs of demo-scale specs, shared by a pool of processes (``run_spec``)
- ``demo``         the deterministic pretraining of the demo ViT; the ``demo`` command
"""
