"""The device transforms against torchvision's: geometry, values, and augmentation statistics."""

import math

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats
from torchvision.transforms import v2

from paperlib.data import transforms as T


def test_paper_transform_shapes_and_normalisation():
    image = Image.fromarray(np.full((40, 60, 3), 255, np.uint8))
    for augment in (False, True):
        out = T.paper_transform(augment, 224)(image)
        assert out.shape == (3, 224, 224) and out.dtype == torch.float32
        expected = (1 - torch.tensor(T.MEAN)) / torch.tensor(T.STD)
        assert torch.allclose(out.mean(dim=(1, 2)), expected, atol=1e-5)


def test_full_box_at_same_size_is_identity_and_integer_box_is_slicing():
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    full = torch.tensor([[0.0, 0.0, 32.0, 32.0]] * 2)
    assert torch.allclose(T.resized_crops(images, full, 32), images.float() / 255, atol=1e-6)
    box = torch.tensor([[3.0, 5.0, 10.0, 10.0]] * 2)
    assert torch.allclose(T.resized_crops(images, box, 10), images[..., 3:13, 5:15].float() / 255, atol=1e-6)


def test_flip_mirrors_the_crop():
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    boxes = torch.tensor([[2.0, 4.0, 20.0, 25.0], [0.0, 0.0, 32.0, 32.0], [10.0, 1.0, 7.0, 9.0]])
    flips = torch.tensor([True, False, True])
    plain = T.resized_crops(images, boxes, 48)
    mirrored = T.resized_crops(images, boxes, 48, flips)
    assert torch.allclose(mirrored[0], plain[0].flip(-1), atol=1e-6)
    assert torch.allclose(mirrored[1], plain[1], atol=1e-6)
    assert torch.allclose(mirrored[2], plain[2].flip(-1), atol=1e-6)


@pytest.mark.parametrize("size", [(32, 32), (40, 64)])
def test_resized_crop_matches_torchvision(size):
    """Same box, same output as torchvision's resized_crop (bilinear upsampling, uint8 rounding aside)."""
    height, width = size
    images = torch.randint(0, 256, (4, 3, height, width), dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, height, width], [3, 5, 20, 17], [10, 2, 8, 30], [1, 1, 11, 11]], dtype=torch.float32)
    ours = T.resized_crops(images, boxes, 224)
    for image, box, out in zip(images, boxes.long().tolist(), ours):
        reference = v2.functional.resized_crop(image.float() / 255, *box, [224, 224], antialias=True)
        assert (out - reference).abs().max() < 1e-4


def test_eval_path_matches_torchvision_eval_transform():
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    ours = T.device_transform(images, augment=False, image_size=224)
    reference = torch.stack([T.paper_transform(False, 224)(image) for image in images])
    # torchvision resizes the uint8 tensor and rounds to uint8 before scaling: at most 1/255 apart
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max() < (1 / 255 + 1e-4) / min(T.STD)


def _torchvision_boxes(n, height, width, seed=0):
    torch.manual_seed(seed)
    image = torch.zeros(3, height, width)
    return np.array(
        [v2.RandomResizedCrop.get_params(image, list(T.SCALE), list(T.RATIO)) for _ in range(n)], dtype=float
    )


@pytest.mark.parametrize("size", [(32, 32), (30, 64)])
def test_crop_distribution_matches_torchvision(size):
    height, width = size
    n = 4000
    ours = T.sample_crops(n, height, width, torch.Generator().manual_seed(1)).numpy()
    theirs = _torchvision_boxes(n, height, width)
    for column, what in ((2, "height"), (3, "width")):
        assert stats.ks_2samp(ours[:, column], theirs[:, column]).pvalue > 1e-3, what
    scale = lambda b: b[:, 2] * b[:, 3] / (height * width)  # noqa: E731
    assert stats.ks_2samp(scale(ours), scale(theirs)).pvalue > 1e-3
    # positions are uniform over the valid range
    top_fraction = lambda b: b[:, 0] / np.maximum(height - b[:, 2], 1)  # noqa: E731
    assert stats.ks_2samp(top_fraction(ours), top_fraction(theirs)).pvalue > 1e-3
    assert (ours[:, 0] >= 0).all() and (ours[:, 0] + ours[:, 2] <= height).all()
    assert (ours[:, 1] >= 0).all() and (ours[:, 1] + ours[:, 3] <= width).all()


def test_crop_scale_range():
    boxes = T.sample_crops(20000, 224, 224, torch.Generator().manual_seed(0)).numpy()
    scale = boxes[:, 2] * boxes[:, 3] / 224**2
    assert scale.min() >= 0.07 and scale.max() <= 1.0
    assert abs(np.median(np.log(boxes[:, 3] / boxes[:, 2]))) < 0.02  # ratios symmetric around 1


def test_flip_rate_is_one_half():
    flips = T.sample_flips(20000, torch.Generator().manual_seed(0))
    assert stats.binomtest(int(flips.sum()), len(flips), 0.5).pvalue > 1e-3


def test_augmented_batch_values_stay_in_range():
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = T.device_transform(images, True, 224, torch.Generator().manual_seed(0))
    low = (0 - torch.tensor(T.MEAN)) / torch.tensor(T.STD)
    high = (1 - torch.tensor(T.MEAN)) / torch.tensor(T.STD)
    assert out.shape == (64, 3, 224, 224)
    assert (out.amin(dim=(0, 2, 3)) >= low - 1e-5).all() and (out.amax(dim=(0, 2, 3)) <= high + 1e-5).all()
    with pytest.raises(ValueError, match="Generator"):
        T.device_transform(images, True, 224)


def test_fallback_box_for_extreme_aspect_ratio():
    # 4 x 400 images: no random box fits the ratio range, the fallback is the central crop clamped to 4:3
    boxes = T.sample_crops(50, 4, 400, torch.Generator().manual_seed(0))
    reference = _torchvision_boxes(50, 4, 400)
    assert np.array_equal(boxes.numpy()[0], reference[0])
    assert math.isclose(boxes[0, 3].item() / boxes[0, 2].item(), 4 / 3, rel_tol=0.2)


def test_normalisation_constants_made_under_inference_mode_serve_autograd_later():
    T._mean_std.cache_clear()
    with torch.inference_mode():
        T.normalize(torch.rand(2, 3, 4, 4))
    images = torch.rand(2, 3, 4, 4, requires_grad=True)
    T.normalize(images).sum().backward()
    assert torch.allclose(images.grad, (1 / torch.tensor(T.STD)).view(3, 1, 1).expand(2, 3, 4, 4))
