import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from paperlib.data import datasets, fixtures
from paperlib.data import transforms as T
from paperlib.data.imagesets import FileDataset, ImageDataset, UnevenImages
from paperlib.data.loader import DeviceLoader, Transform, resized_size, uint8_images


@pytest.fixture(scope="module")
def digits():
    return datasets.get_dataset("digits", "trainval")


def test_one_epoch_visits_every_image_once(digits):
    loader = DeviceLoader(digits, batch_size=100, transform=Transform(True, 48), seed=3)
    assert len(loader) == 8
    labels, shapes = [], set()
    for images, targets in loader:
        shapes.add(tuple(images.shape[1:]))
        assert images.dtype == torch.float32
        labels.append(targets)
    labels = torch.cat(labels)
    assert shapes == {(3, 48, 48)} and len(labels) == len(digits)
    assert torch.equal(labels.sort().values, digits.targets.sort().values)


def test_same_seed_same_batches_other_seed_other_batches(digits):
    first = next(iter(DeviceLoader(digits, 32, Transform(True, 32), seed=0)))[0]
    again = next(iter(DeviceLoader(digits, 32, Transform(True, 32), seed=0)))[0]
    other = next(iter(DeviceLoader(digits, 32, Transform(True, 32), seed=1)))[0]
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_eval_loader_is_the_plain_dataset(digits):
    images, targets = next(iter(DeviceLoader(digits, 16, Transform(False, 32), drop_last=True)))
    reference = torch.stack([digits[i][0] for i in range(16)])
    assert torch.allclose(images, reference, atol=1e-5) and torch.equal(targets, digits.targets[:16])


def test_rejects_file_datasets_and_bad_batch_size(tmp_path, digits):
    fixtures.write_pets(tmp_path)
    with pytest.raises(TypeError, match="uint8_images"):
        DeviceLoader(datasets.get_dataset("pets", "train", root=tmp_path), 4, Transform(False, 32))
    with pytest.raises(ValueError, match="batch_size"):
        DeviceLoader(digits, 0, Transform(False, 32))


def test_file_dataset_decoded_once_and_cached(tmp_path):
    fixtures.write_pets(tmp_path / "root")
    dataset = datasets.get_dataset("pets", "trainval", root=tmp_path / "root")
    cached = uint8_images(dataset, cache_size=24, cache_dir=tmp_path / "cache")
    # whole images, shorter side 24, aspect ratio kept (the fixture's are 48x40)
    assert isinstance(cached.images, UnevenImages) and len(cached.images) == len(dataset)
    assert cached.images.sizes.tolist() == [[24, 28]] * len(dataset) and cached.images.pixels.dtype == torch.uint8
    assert torch.equal(cached.targets, dataset.targets)
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*.npy"))
    assert len(files) == 2 and files[0].endswith("-sizes.npy") and not list((tmp_path / "cache").rglob("*.tmp"))
    # a second call reads the cache (the image files are gone now)
    for file in dataset.files:
        file.unlink()
    again = uint8_images(dataset, cache_size=24, cache_dir=tmp_path / "cache")
    assert torch.equal(again.images.pixels, cached.images.pixels)
    # a part of the dataset is read from the whole's cache
    part = uint8_images(dataset.subset([3, 0], "val"), cache_size=24, cache_dir=tmp_path / "cache")
    assert torch.equal(part.images[0], cached.images[3]) and torch.equal(part.images[1], cached.images[0])
    # and the cached images feed the device path
    images, _ = next(iter(DeviceLoader(again, 4, Transform(True, 16))))
    assert images.shape == (4, 3, 16, 16)


def test_cache_goes_under_the_data_root_the_dataset_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "default"))
    fixtures.write_pets(tmp_path / "elsewhere")
    uint8_images(datasets.get_dataset("pets", "test", root=tmp_path / "elsewhere"), cache_size=16)
    assert len(list((tmp_path / "elsewhere" / "cache").rglob("*.npy"))) == 2 and not (tmp_path / "default").exists()


def test_cached_image_is_the_whole_image_resized(tmp_path):
    fixtures.write_pets(tmp_path)
    dataset = datasets.get_dataset("pets", "test", root=tmp_path)
    cached = uint8_images(dataset, cache_size=20, cache_dir=tmp_path / "cache")
    from PIL import Image

    with Image.open(dataset.files[0]) as image:
        width, height = image.size
        assert (width, height) == (48, 40)
        reference = np.asarray(image.convert("RGB").resize((24, 20), Image.BILINEAR))
    ours = cached.images[0].permute(1, 2, 0).numpy().astype(int)
    assert ours.shape == reference.shape
    assert np.abs(ours - reference.astype(int)).mean() < 8  # same geometry, resampling filters differ
    assert resized_size(40, 48, 20) == (20, 24) and resized_size(600, 400, 256) == (384, 256)
    # an image no larger than the cache is kept as it is, not upsampled
    assert resized_size(40, 48, 256) == (40, 48) and resized_size(40, 300, 40) == (40, 300)
    kept = uint8_images(dataset, cache_size=256, cache_dir=tmp_path / "cache")
    with Image.open(dataset.files[0]) as image:
        assert torch.equal(kept.images[0], torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1))


def test_training_crops_reach_the_borders_of_wide_images(tmp_path):
    """A 3:1 image whose left and right sixths are white: a centre square (the old cache) never
    shows them; RandomResizedCrop on the whole image does, as often as torchvision's own crops."""
    from PIL import Image

    pixels = np.zeros((40, 120, 3), np.uint8)
    pixels[:, :20] = pixels[:, 100:] = 255
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    dataset = FileDataset([tmp_path / "wide.png"], [0], ["a"], "wide", "test")
    cached = uint8_images(dataset, cache_size=20, cache_dir=tmp_path / "cache")
    assert cached.images.sizes.tolist() == [[20, 60]]
    loader = DeviceLoader(cached, 1, Transform(True, 8, ((0, 0, 0), (1, 1, 1))), seed=0)
    ours = np.mean([bool((loader.batch(step)[0] > 0.5).any()) for step in range(400)])
    torch.manual_seed(0)
    crop = v2.RandomResizedCrop(8, scale=T.SCALE, ratio=T.RATIO)
    theirs = np.mean([bool((crop(torch.from_numpy(pixels).permute(2, 0, 1)) > 127).any()) for _ in range(400)])
    assert theirs > 0.3 and abs(ours - theirs) < 0.1


def test_padding_of_uneven_batches_is_never_read():
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, size, generator=generator, dtype=torch.uint8) for size in [(3, 9, 14), (3, 12, 7)]]
    uneven = UnevenImages(torch.cat([i.reshape(-1) for i in images]), [[9, 14], [12, 7]])
    batch, sizes = uneven.batch(torch.tensor([0, 1]))
    assert batch.shape == (2, 3, 12, 14) and sizes.tolist() == [[9, 14], [12, 7]]
    together = T.device_transform(batch, False, 6, sizes=sizes)
    for row, image in enumerate(images):
        assert torch.allclose(together[row], T.device_transform(image[None], False, 6)[0], atol=1e-6)
    boxes = T.sample_crops(2, sizes[:, 0], sizes[:, 1], torch.Generator().manual_seed(1))
    together = T.resized_crops(batch, boxes, 6)
    for row, image in enumerate(images):
        assert torch.allclose(together[row], T.resized_crops(image[None], boxes[row : row + 1], 6)[0], atol=1e-6)


def test_data_benchmark_runs_and_reports_both_paths(capsys):
    from benchmarks import __main__ as bench

    bench.main(
        [
            "data",
            "--dataset",
            "cifar10",
            "--batch-size",
            "8",
            "--image-size",
            "16",
            "--batches",
            "2",
            "--workers",
            "0",
            "--fixture-size",
            "40",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr().out
    rates = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if "images_per_s" in line}
    assert set(rates) == {"dataloader_images_per_s", "device_path_images_per_s"} and min(rates.values()) > 0


def test_images_kept_on_host_give_the_same_batches(digits):
    on_device = list(DeviceLoader(digits, 64, Transform(True, 24), seed=2))
    on_host = list(DeviceLoader(digits, 64, Transform(True, 24), seed=2, images_on="host"))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(on_device, on_host))
    with pytest.raises(ValueError, match="'device', 'host' or 'auto'"):
        DeviceLoader(digits, 64, Transform(True, 24), images_on="disk")


def test_auto_placement_keeps_large_datasets_in_host_memory(digits):
    from paperlib.data.loader import placement

    gib = 2**30
    # DomainNet sketch on an 80 GB GPU
    assert placement(14 * gib, torch.device("cuda"), total_memory=80 * gib) == "device"
    assert placement(14 * gib, torch.device("cuda"), total_memory=24 * gib) == "host"
    assert placement(14 * gib, torch.device("cpu")) == "device"  # on a CPU the images are in memory anyway
    assert DeviceLoader(digits, 64, Transform(False, 24), images_on="auto").images_on == "device"


def test_batch_at_step_is_stateless_and_walks_epochs(digits):
    loader = DeviceLoader(digits, 100, Transform(True, 32), seed=5)
    first = loader.batch(3)
    loader.batch(0)  # other calls in between change nothing
    again = DeviceLoader(digits, 100, Transform(True, 32), seed=5).batch(3)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    plain = DeviceLoader(digits, 100, Transform(False, 32), seed=5)
    seen = torch.cat([plain.batch(s)[0] for s in range(len(digits) // 100)])  # the first epoch: no repeats
    assert len({bytes(image.numpy()) for image in seen}) == 700
    assert loader.batch(7)[0].shape == (100, 3, 32, 32)  # crosses into the second epoch


def test_with_drop_last_an_epoch_is_its_whole_batches():
    # the authors' training loader: shuffled each epoch, the last incomplete batch dropped
    n, size = 700, 128
    images = torch.zeros(n, 3, 8, 8, dtype=torch.uint8)
    images[:, 0, 0, 0], images[:, 1, 0, 0] = torch.arange(n) % 256, torch.arange(n) // 256  # each image's index
    marked = ImageDataset(images, torch.zeros(n, dtype=torch.int64), ["0"], "marked", "train", list(range(n)))
    loader = DeviceLoader(marked, size, Transform(False, 8, ((0,) * 3, (1,) * 3)), seed=3, drop_last=True)
    per_epoch = n // size

    def positions(step):
        pixels = (loader.batch(step)[0][:, :2, 0, 0] * 255).round().long()
        return (pixels[:, 0] + 256 * pixels[:, 1]).tolist()

    epochs = [[i for step in range(e * per_epoch, (e + 1) * per_epoch) for i in positions(step)] for e in (0, 1)]
    for seen in epochs:  # no image twice in an epoch, and n - per_epoch * size left out
        assert len(seen) == len(set(seen)) == per_epoch * size and set(seen) <= set(range(n))
    assert set(epochs[0]) != set(epochs[1])  # another epoch, another draw (and other images left out)
    # fewer images than a batch: the batches go on across epochs, nothing to drop
    whole = DeviceLoader(marked, n + 10, Transform(False, 8), seed=3, drop_last=True)
    assert whole.batch(0)[0].shape[0] == n + 10


def test_every_seeds_train_and_val_splits_share_one_cache_of_the_official_split(tmp_path):
    from paperlib.data import fixtures

    fixtures.write_domainnet(tmp_path, n_classes=3, per_class=10)
    whole = uint8_images(datasets.get_dataset("domainnet/clipart", "trainval", root=tmp_path), cache_size=16)
    by_key = {key: i for i, key in enumerate(whole.keys)}
    for seed in (0, 42):
        for split in ("train", "val"):
            part = datasets.get_dataset("domainnet/clipart", split, root=tmp_path, seed=seed)
            cached = uint8_images(part, cache_size=16)
            assert cached.keys == part.keys and torch.equal(cached.targets, part.targets)
            # the part's own images, in its order
            picked = whole.images.select([by_key[k] for k in part.keys])
            assert torch.equal(cached.images.pixels, picked.pixels) and torch.equal(cached.images.sizes, picked.sizes)
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 2  # the official training split's, once (pixels, sizes)
    uint8_images(datasets.get_dataset("domainnet/clipart", "test", root=tmp_path), cache_size=16)
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 4
    # the part decoded on its own gives the same pixels as the part taken from the whole's cache
    alone = datasets.get_dataset("domainnet/clipart", "val", root=tmp_path, seed=42)
    alone.parent = None
    assert torch.equal(
        uint8_images(alone, cache_size=16, cache_dir=tmp_path / "alone").images.pixels,
        uint8_images(
            datasets.get_dataset("domainnet/clipart", "val", root=tmp_path, seed=42), cache_size=16
        ).images.pixels,
    )
