"""Data: the demo world, the paper's 11 benchmarks and the reference images, split and transformed (appendix C.2).

- ``splits``       how datasets are split: the authors' train/test and validation draws
- ``transforms``   the paper's transforms, per image (torchvision) and per batch on the device
- ``corruptions``  CIFAR-10-C corruptions at a given severity (Hendrycks & Dietterich, 2019)
- ``imagesets``    ``ImageDataset`` (uint8 images in memory) and ``FileDataset`` (image files)
- ``datasets``     ``get_dataset``: every dataset by name, with its splits
- ``loader``       the fast data path: uint8 caches and ``DeviceLoader``
- ``augmented``    the authors' training loader, seeded: one random crop and flip of each image, shuffled
- ``fixtures``     tiny datasets in the official on-disk formats (tests, benchmarks)
"""
