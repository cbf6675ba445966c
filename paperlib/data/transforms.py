"""The paper's image transforms, as torchvision transforms and as batched device operations.

Appendix C.2: training images get a random resized crop to 224 and a random horizontal flip;
evaluation images are resized to 224 and centre-cropped to 224; all are normalised with the
ImageNet mean and standard deviation. The resolution is a parameter (the demo world uses 32), and
so is the normalisation (``mean_std``; ``names.NORMALIZATIONS`` name the choices: the paper's ImageNet
statistics, or those a model was pretrained with, beyond the paper).

``paper_transform`` is the torchvision path (per image, in DataLoader workers). The device path
does the same on whole uint8 batches where they live (GPU or CPU): ``sample_crops`` draws crop
boxes with the distribution of ``torchvision.transforms.v2.RandomResizedCrop`` and
``resized_crops`` resamples every crop (flipped or not) with two batched matrix products.
"""

from __future__ import annotations

import functools
import math

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torchvision.transforms import v2

MEAN = IMAGENET_DEFAULT_MEAN
STD = IMAGENET_DEFAULT_STD
IMAGENET = (tuple(MEAN), tuple(STD))
"""The paper's normalisation (appendix C.2): ImageNet's per-channel mean and standard deviation."""


def as_mean_std(mean, std) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(mean, std)`` as two tuples of three finite floats.

    The standard deviations positive (hashable: the device tensors made from them are cached)."""
    try:
        pair = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"mean and std must be three numbers each (one per RGB channel), got {mean!r} and {std!r}"
        ) from error
    if len(pair[0]) != 3 or len(pair[1]) != 3 or not all(map(math.isfinite, pair[0] + pair[1])) or min(pair[1]) <= 0:
        raise ValueError(
            "mean and std must be three finite numbers each (one per RGB channel), std positive; "
            f"got {mean!r} and {std!r}"
        )
    return pair


SCALE = (0.08, 1.0)  # RandomResizedCrop's defaults, as in the paper's protocol
RATIO = (3.0 / 4.0, 4.0 / 3.0)


def paper_transform(augment: bool, image_size: int = 224, mean_std: tuple = IMAGENET) -> v2.Compose:
    """The paper's transform (appendix C.2): PIL image or uint8 tensor -> normalised float tensor.

    ``mean_std``: the normalisation, ImageNet's by default."""
    if augment:
        geometry = [
            v2.RandomResizedCrop(image_size, scale=SCALE, ratio=RATIO, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    else:
        geometry = [v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose([v2.ToImage(), *geometry, v2.ToDtype(torch.float32, scale=True), v2.Normalize(*mean_std)])


def per_image(size: int | torch.Tensor, n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(n,) image sizes on ``device``, from one size or a tensor of each image's own.

    One size is filled there (copying a host number to a GPU would make the host wait)."""
    if isinstance(size, torch.Tensor):
        return size.to(device=device, dtype=dtype).expand(n)
    return torch.full((n,), size, dtype=dtype, device=device)


def sample_crops(
    n: int,
    height: int | torch.Tensor,
    width: int | torch.Tensor,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    attempts: int = 10,
) -> torch.Tensor:
    """Random resized crop boxes (top, left, h, w) for ``n`` images, shape (n, 4), float.

    The vectorised twin of ``RandomResizedCrop.get_params``: up to ``attempts`` draws of an area
    fraction in ``SCALE`` and a log-uniform aspect ratio in ``RATIO``; the first box that fits is
    kept, and images where none fits fall back to the central crop with the ratio clamped.
    ``height`` and ``width``: one size for every image, or (n,) tensors, each image's own.
    """
    height = per_image(height, n, torch.float64, device)[:, None]
    width = per_image(width, n, torch.float64, device)[:, None]
    area = (height * width).float()
    scale = torch.empty(n, attempts, device=device).uniform_(*SCALE, generator=generator) * area
    log_ratio = torch.empty(n, attempts, device=device).uniform_(
        math.log(RATIO[0]), math.log(RATIO[1]), generator=generator
    )
    ratio = torch.exp(log_ratio)
    w = torch.round(torch.sqrt(scale * ratio))
    h = torch.round(torch.sqrt(scale / ratio))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(fits.int(), dim=1)  # first attempt that fits (0 when none does)
    any_fit = fits.any(dim=1)
    rows = torch.arange(n, device=device)
    h, w = h[rows, first], w[rows, first]
    # fallback: whole image, ratio clamped to RATIO, centred
    height, width = height[:, 0], width[:, 0]
    in_ratio = width / height
    fw = torch.where(in_ratio > RATIO[1], torch.round(height * RATIO[1]), width)
    fh = torch.where(in_ratio < RATIO[0], torch.round(width / RATIO[0]), height)
    h = torch.where(any_fit, h, fh.to(h.dtype))
    w = torch.where(any_fit, w, fw.to(w.dtype))
    u = torch.rand(n, 2, device=device, generator=generator)
    top = torch.where(
        any_fit, torch.floor(u[:, 0] * (height - h + 1)), torch.div(height - fh, 2, rounding_mode="floor")
    )
    left = torch.where(any_fit, torch.floor(u[:, 1] * (width - w + 1)), torch.div(width - fw, 2, rounding_mode="floor"))
    return torch.stack([top, left, h, w], dim=1).to(h.dtype)


def center_boxes(
    n: int,
    height: int | torch.Tensor,
    width: int | torch.Tensor,
    image_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Boxes equivalent to ``Resize(image_size)`` then ``CenterCrop(image_size)``.

    The central square of side ``min(height, width)`` (for the crop of a square output); ``height`` and
    ``width`` as in ``sample_crops``."""
    height = per_image(height, n, torch.float32, device)
    width = per_image(width, n, torch.float32, device)
    side = torch.minimum(height, width)
    return torch.stack([(height - side) / 2, (width - side) / 2, side, side], dim=1)


def interpolation_matrices(start: torch.Tensor, length: torch.Tensor, in_size: int, out_size: int) -> torch.Tensor:
    """Bilinear resampling of the intervals ``[start, start + length)`` to ``out_size`` pixels.

    Returns (B, out_size, in_size) matrices M with ``M @ signal`` the resampled signal: output
    pixel ``i`` reads source coordinate ``start + (i + 0.5) * length / out_size - 0.5``
    (``align_corners=False``, as ``F.interpolate``), clamped to the interval like a crop.
    """
    b = start.shape[0]
    i = torch.arange(out_size, device=start.device, dtype=start.dtype)
    x = start[:, None] + (i[None, :] + 0.5) * (length[:, None] / out_size) - 0.5
    low_edge, high_edge = start[:, None], (start + length - 1)[:, None]
    x = torch.minimum(torch.maximum(x, low_edge), high_edge)
    x0 = torch.floor(x)
    w1 = x - x0
    x1 = torch.minimum(x0 + 1, high_edge)
    matrices = torch.zeros(b, out_size, in_size, device=start.device, dtype=start.dtype)
    matrices.scatter_add_(2, x0.long()[..., None], (1 - w1)[..., None])
    matrices.scatter_add_(2, x1.long()[..., None], w1[..., None])
    return matrices


def resized_crops(
    images: torch.Tensor, boxes: torch.Tensor, image_size: int, flips: torch.Tensor | None = None
) -> torch.Tensor:
    """Crop ``boxes`` out of ``images`` and resize each to ``image_size``, flipped where asked.

    ``boxes``: (top, left, h, w); ``images``: uint8 or float (B, C, H, W); bilinear, mirrored where
    ``flips``; returns float in [0, 1].

    Bilinear resampling is separable, so each crop is two small matrix products,
    ``rows @ image @ columns^T``: batched matmuls that keep a GPU (or a CPU's BLAS) busy, where
    ``grid_sample`` gathers pixel by pixel. Like ``F.interpolate`` without
    antialiasing, which is what torchvision does when it upsamples (every Cifar crop to 224).
    """
    _, _, height, width = images.shape
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    top, left, h, w = boxes.to(device=x.device, dtype=x.dtype).unbind(dim=1)
    rows = interpolation_matrices(top, h, height, image_size)
    columns = interpolation_matrices(left, w, width, image_size)
    if flips is not None:
        columns = torch.where(flips.to(x.device)[:, None, None], columns.flip(1), columns)
    return rows[:, None] @ x @ columns.transpose(1, 2)[:, None]


@functools.lru_cache(maxsize=None)
def _mean_std(device: torch.device, dtype: torch.dtype, pair: tuple = IMAGENET) -> tuple[torch.Tensor, torch.Tensor]:
    # made once per device: a tensor built from Python numbers on a GPU is a blocking copy, which
    # once per batch would make the host wait for the GPU at every training step
    # (normal tensors even when first asked for under inference_mode, so that autograd may save them)
    with torch.inference_mode(False):
        return tuple(torch.tensor(values, dtype=dtype).view(3, 1, 1).to(device) for values in pair)


def normalize(images: torch.Tensor, mean_std: tuple = IMAGENET) -> torch.Tensor:
    """Float images in [0, 1] normalised with ``mean_std``.

    Images are (3, H, W) or (..., 3, H, W); ``mean_std`` is ImageNet's by default."""
    mean, std = _mean_std(images.device, images.dtype, as_mean_std(*mean_std))
    return (images - mean) / std


def sample_flips(n: int, generator: torch.Generator, device: torch.device | str = "cpu") -> torch.Tensor:
    """Horizontal flips with probability 1/2, as ``RandomHorizontalFlip``; bool (n,)."""
    return torch.rand(n, device=device, generator=generator) < 0.5


def device_transform(
    images: torch.Tensor,
    augment: bool,
    image_size: int,
    generator: torch.Generator | None = None,
    mean_std: tuple = IMAGENET,
    sizes: torch.Tensor | None = None,
) -> torch.Tensor:
    """The paper's transform on a uint8 (B, 3, H, W) batch, where the batch lives.

    ``mean_std``: the normalisation, ImageNet's by default; ``sizes``: (B, 2) heights and widths of images of
    different sizes, padded to (H, W) at the bottom and right, as ``UnevenImages.batch`` gives them.

    Normalisation commutes with bilinear resampling (its weights sum to one), so it is applied
    to the small source images, not to the 224x224 outputs.
    """
    b, _, height, width = images.shape
    x = normalize(images.float() / 255.0, mean_std)
    if sizes is not None:
        height, width = sizes.to(images.device).unbind(dim=1)
    if augment:
        if generator is None:
            raise ValueError("augment=True needs a torch.Generator on the images' device")
        boxes = sample_crops(b, height, width, generator, images.device)
        return resized_crops(x, boxes, image_size, sample_flips(b, generator, images.device))
    if sizes is None and (height, width) == (image_size, image_size):
        return x
    return resized_crops(x, center_boxes(b, height, width, image_size, images.device), image_size)
