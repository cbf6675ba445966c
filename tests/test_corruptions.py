import numpy as np
import pytest

from paperlib.data import corruptions
from paperlib.data.corruptions import CORRUPTIONS, corrupt


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(7)
    smooth = np.linspace(0, 255, 32, dtype=np.float64)[None, :, None] * np.ones((4, 32, 1, 3))
    noisy = rng.integers(0, 256, size=(4, 32, 32, 3))
    return np.concatenate([smooth, noisy]).astype(np.uint8)


@pytest.mark.parametrize("name", CORRUPTIONS)
@pytest.mark.parametrize("severity", [1, 5])
def test_shape_dtype_range_and_effect(images, name, severity):
    out = corrupt(images, name, severity=severity)
    assert out.shape == images.shape and out.dtype == np.uint8
    assert not np.array_equal(out, images)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_float_functions_stay_in_unit_range(images, name):
    function = corruptions._FUNCTIONS[name]
    x = images[4].astype(np.float64) / 255
    y = function(x, 5, np.random.default_rng(0))
    assert y.shape == x.shape and y.min() >= 0.0 and y.max() <= 1.0


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_deterministic_and_independent_of_batch(images, name):
    np.random.seed(1)
    first = corrupt(images, name)
    np.random.seed(2)
    assert np.array_equal(first, corrupt(images, name))
    # image 3 alone, with its key, is corrupted exactly as inside the batch
    assert np.array_equal(first[3:4], corrupt(images[3:4], name, keys=[3]))


def test_severity_increases_the_damage(images):
    for name in ("gaussian_noise", "speckle_noise", "contrast"):
        errors = [np.abs(corrupt(images, name, s).astype(int) - images).mean() for s in (1, 5)]
        assert errors[1] > errors[0], name


def test_contrast_pulls_towards_channel_means():
    image = np.zeros((1, 8, 8, 3), np.uint8)
    image[0, :, :4] = 200  # half the image bright
    out = corrupt(image, "contrast", 5)
    # factor 0.15 around mean 100: 100 + 0.15 * (200 - 100) = 115 and 100 - 15 = 85
    assert set(np.unique(out[0, :, :4])) == {115} and set(np.unique(out[0, :, 4:])) == {85}


def test_gaussian_noise_has_the_severity_5_std():
    image = np.full((1, 64, 64, 3), 128, np.uint8)
    noise = corrupt(image, "gaussian_noise", 5).astype(float) / 255 - 128 / 255
    assert noise.std() == pytest.approx(0.10, rel=0.05)  # CIFAR-10-C severity 5: std 0.10


def test_motion_blur_kernel_is_one_sided_and_normalised():
    weights, offsets = corruptions.motion_blur_kernel(9, 2.5, 0.0)
    assert len(weights) == 19 and weights.sum() == pytest.approx(1.0)
    assert np.all(np.diff(weights) < 0)  # decays away from the pixel
    assert offsets[:, 0].tolist() == [0] * 19 and offsets[:, 1].tolist() == list(range(19))
    _, offsets = corruptions.motion_blur_kernel(2, 1.0, 90.0)
    assert offsets[:, 1].tolist() == [0] * 5 and offsets[:, 0].tolist() == list(range(5))


def test_motion_blur_preserves_a_constant_image():
    image = np.full((1, 16, 16, 3), 77, np.uint8)
    assert np.abs(corrupt(image, "motion_blur", 5).astype(int) - 77).max() <= 1


def test_bad_arguments_list_valid_choices(images):
    with pytest.raises(
        ValueError, match="valid corruptions: contrast, gaussian_noise, motion_blur, snow, speckle_noise"
    ):
        corrupt(images, "fog")
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(images, "snow", severity=6)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\)"):
        corrupt(images.transpose(0, 3, 1, 2), "snow")
