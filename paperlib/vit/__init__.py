"""The ViT and its components (§2-3): the models by name, the five components, and how a run trains one.

- ``components``      the five transformer components of a block, what a run trains, Tables 3 and 4
- ``models``          the paper's ViTs by short name, any timm ViT, the demo ViT, your own
- ``lora``            LoRA on one component (beyond the paper), and its trainer
- ``equal_capacity``  a component trained on as many parameters as a LayerNorm (beyond the paper), and its trainer
- ``methods``         the base ``Trainer``, and the trainer a method names (``trainer_of``)
"""
