"""Image corruptions of CIFAR-10-C, reimplemented without ImageMagick or OpenCV.

Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations", ICLR 2019; parameters from their ``make_cifar_c.py`` (the CIFAR-sized set, not the
ImageNet one). The paper uses five corruptions at severity 5 (appendix C.2); the demo world applies
the same five to the digits.

Each corruption takes an (H, W, 3) float image in [0, 1], a severity in 1..5 and a numpy Generator
and returns an image in [0, 1]. ``corrupt`` applies one to a uint8 batch with one generator per
image, seeded by (seed, corruption, image index), so a corrupted image never depends on global
random state, on the order of the batch, or on which other images are corrupted.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import ndimage

from paperlib.records.names import check_choice

CORRUPTIONS = ("contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise")
"""The five corruptions of the paper (appendix C.2)."""

SEVERITIES = (1, 2, 3, 4, 5)

# CIFAR-10-C parameters per severity 1..5 (make_cifar_c.py).
_GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)  # noise std
_SPECKLE_NOISE = (0.06, 0.10, 0.12, 0.16, 0.20)  # multiplicative noise std
_CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)  # contrast factor around the channel means
_MOTION_BLUR = ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5))  # ImageMagick (radius, sigma)
# snow: (mean, std, zoom, threshold, blur radius, blur sigma, image weight)
_SNOW = (
    (0.10, 0.2, 1.00, 0.60, 8, 3, 0.95),
    (0.10, 0.2, 1.00, 0.50, 10, 4, 0.90),
    (0.15, 0.3, 1.75, 0.55, 10, 4, 0.90),
    (0.25, 0.3, 2.25, 0.60, 12, 6, 0.85),
    (0.30, 0.3, 1.25, 0.65, 14, 12, 0.80),
)


def check_severity(severity: int) -> int:
    """Return ``severity`` or raise a ValueError that names the valid severities."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    return severity


def _level(severity: int) -> int:
    """Index of ``severity`` in the per-severity parameter tables."""
    return check_severity(severity) - 1


def gaussian_noise(image: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise."""
    std = _GAUSSIAN_NOISE[_level(severity)]
    return np.clip(image + rng.normal(scale=std, size=image.shape), 0.0, 1.0)


def speckle_noise(image: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative Gaussian noise, ``x + x * n``."""
    std = _SPECKLE_NOISE[_level(severity)]
    return np.clip(image + image * rng.normal(scale=std, size=image.shape), 0.0, 1.0)


def contrast(image: np.ndarray, severity: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Pull every pixel towards its channel mean (deterministic)."""
    factor = _CONTRAST[_level(severity)]
    means = image.mean(axis=(0, 1), keepdims=True)
    return np.clip((image - means) * factor + means, 0.0, 1.0)


def motion_blur_kernel(radius: float, sigma: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """ImageMagick's one-sided motion-blur kernel: (weights, integer (dy, dx) offsets).

    ``2 * ceil(radius) + 1`` taps with Gaussian weights ``exp(-i^2 / 2 sigma^2)``, normalised,
    at rounded offsets ``i * (cos(angle), sin(angle))`` (x, y) along the blur direction.
    """
    width = int(2 * np.ceil(radius) + 1)
    taps = np.arange(width, dtype=np.float64)
    weights = np.exp(-(taps**2) / (2.0 * sigma**2))
    weights /= weights.sum()
    theta = np.deg2rad(angle)
    dx = np.ceil(taps * np.cos(theta) - 0.5).astype(int)
    dy = np.ceil(taps * np.sin(theta) - 0.5).astype(int)
    return weights, np.stack([dy, dx], axis=1)


def _motion_blur(image: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """Blur an (H, W, C) image along ``angle`` degrees; pixels past the border repeat the edge."""
    height, width = image.shape[:2]
    weights, offsets = motion_blur_kernel(radius, sigma, angle)
    rows, cols = np.arange(height), np.arange(width)
    out = np.zeros_like(image, dtype=np.float64)
    for weight, (dy, dx) in zip(weights, offsets):
        r = np.clip(rows + dy, 0, height - 1)
        c = np.clip(cols + dx, 0, width - 1)
        out += weight * image[r][:, c]
    return out


def motion_blur(image: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Motion blur in a random direction within 45 degrees of horizontal."""
    radius, sigma = _MOTION_BLUR[_level(severity)]
    angle = rng.uniform(-45.0, 45.0)
    return np.clip(_motion_blur(image, radius, sigma, angle), 0.0, 1.0)


def _clipped_zoom(layer: np.ndarray, factor: float) -> np.ndarray:
    """Zoom into the centre of a square 2-D layer, keeping its size (bilinear)."""
    size = layer.shape[0]
    crop = int(np.ceil(size / factor))
    top = (size - crop) // 2
    zoomed = ndimage.zoom(layer[top : top + crop, top : top + crop], factor, order=1)
    trim = (zoomed.shape[0] - size) // 2
    return zoomed[trim : trim + size, trim : trim + size]


def snow(image: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Snowflakes: a thresholded noise layer, motion-blurred downwards, added twice (rotated)."""
    mean, std, zoom, threshold, blur_radius, blur_sigma, weight = _SNOW[_level(severity)]
    height, width = image.shape[:2]
    if height != width:
        raise ValueError(f"snow expects square images, got {height}x{width}")
    layer = rng.normal(loc=mean, scale=std, size=(height, width))
    layer = _clipped_zoom(layer, zoom)
    layer[layer < threshold] = 0.0
    # The reference stores the layer as an 8-bit PNG before blurring it.
    layer = np.floor(np.clip(layer, 0.0, 1.0) * 255.0) / 255.0
    layer = _motion_blur(layer[..., None], blur_radius, blur_sigma, rng.uniform(-135.0, -45.0))
    gray = image @ np.array([0.299, 0.587, 0.114])
    image = weight * image + (1.0 - weight) * np.maximum(image, gray[..., None] * 1.5 + 0.5)
    return np.clip(image + layer + np.rot90(layer, k=2), 0.0, 1.0)


_FUNCTIONS = {function.__name__: function for function in (contrast, gaussian_noise, motion_blur, snow, speckle_noise)}


def check_corruption(name: str) -> str:
    """Return ``name`` or raise a ValueError that names the valid corruptions."""
    return check_choice(name, CORRUPTIONS, "corruption", "corruptions")


def corrupt(
    images: np.ndarray, name: str, severity: int = 5, seed: int = 0, keys: Sequence[int] | None = None
) -> np.ndarray:
    """Corrupt a uint8 batch of (N, H, W, 3) images; returns uint8 of the same shape.

    Image ``i`` draws its randomness from ``np.random.default_rng([seed, k, keys[i]])`` with ``k``
    the index of the corruption in ``CORRUPTIONS`` and ``keys`` the images' positions in their
    dataset (default ``0..N-1``). Values are truncated to uint8 as in the reference.
    """
    check_corruption(name)
    check_severity(severity)
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected uint8 images of shape (N, H, W, 3), got {images.dtype} {images.shape}")
    keys = range(len(images)) if keys is None else [int(k) for k in keys]
    if len(keys) != len(images) or min(keys, default=0) < 0:
        raise ValueError(f"expected {len(images)} non-negative keys, got {len(keys)}")
    function = _FUNCTIONS[name]
    corruption_key = CORRUPTIONS.index(name)
    out = np.empty_like(images)
    for i, (image, key) in enumerate(zip(images, keys)):
        rng = np.random.default_rng([seed, corruption_key, key])
        result = function(image.astype(np.float64) / 255.0, severity, rng)
        out[i] = (np.clip(result, 0.0, 1.0) * 255.0).astype(np.uint8)
    return out
