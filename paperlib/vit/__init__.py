"""The ViT and its components (§2-3): the models by name, the five components, and how a run trains one.

- ``components``      the five transformer components of a block, what a run trains, Tables 3 and 4
- ``models``          the paper's ViTs by short name, any timm ViT, the demo ViT, your own
- ``lora``            LoRA on one component (beyond the paper)
- ``equal_capacity``  a component trained on as many parameters per block as a LayerNorm has (beyond the paper)
- ``methods``         what each way to train a component does to a model (its ``Trainer``), by name
"""
