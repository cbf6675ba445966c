"""Measurement of a pretrained ViT: plasticity, its bounds and linear probing (§4, §5.1, Table 6's last column).

- ``component_rates``  the rate of change of every component on image pairs (Definition 1), exact and fast
- ``plasticity``       P(f) of every component: a ``Measurement``, measured and saved; the ``plasticity`` command
- ``probe_features``   what a linear probe is fitted on: every probe point pooled, from one forward pass (hooks)
- ``probe``            linear probing of the pretrained model as the authors' code does it (``Probe``, cached)
- ``bounds``           upper bounds on plasticity (Propositions 1-4) and the data constants they need
"""
