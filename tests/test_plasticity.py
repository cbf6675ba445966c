"""The plasticity measurement against Definition 1 read literally."""

import dataclasses
import json

import pytest
import timm
import torch
from conftest import found

from paperlib.analysis import plasticity_table, ranking
from paperlib.data import datasets
from paperlib.measure import component_rates, plasticity
from paperlib.measure.plasticity import Measurement, PairDraw, Running
from paperlib.records import measurements, names, paths, specs, storage
from paperlib.vit import components, models
from paperlib.vit.components import COMPONENTS


def _perturb(model, seed=0):
    """Non-trivial weights everywhere: LayerNorm gains and biases, all biases, layer scales."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def demo():
    return _perturb(models.create_model("demo", pretrained=False))


@pytest.fixture(scope="module")
def layer_scale():
    # DINOv2-style blocks: layer scale after attention and MLP
    model = timm.create_model(
        "vit_small_patch14_dinov2",
        pretrained=False,
        img_size=28,
        patch_size=7,
        embed_dim=48,
        depth=3,
        num_heads=3,
        init_values=0.5,
    )
    return _perturb(model, seed=1)


def _pairs(n=6, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randn(n, 3, size, size, generator=g)


@pytest.mark.parametrize("fixture, size", [("demo", 32), ("layer_scale", 28)])
def test_fast_rates_equal_the_plain_definition(request, fixture, size):
    model = request.getfixturevalue(fixture)
    x, y = _pairs(size=size)
    fast = component_rates.rate_tensor(model, x, y)
    with torch.no_grad():
        plain = component_rates.plain_rates(model, x, y)
    assert fast.shape == (len(model.blocks), 5, len(x))
    assert torch.allclose(fast, plain, rtol=1e-4, atol=1e-6)


def test_layer_norms_with_other_eps_or_no_gain_equal_the_plain_definition(tiny_vit):
    # the shortcut shares each LayerNorm's normalisation across blocks: it must key it by eps and
    # read a missing gain as ones
    model = _perturb(tiny_vit(), seed=2)
    d = model.embed_dim
    model.blocks[1].norm2 = torch.nn.LayerNorm(d, eps=1e-2, elementwise_affine=False)
    model.blocks[2].norm1 = torch.nn.LayerNorm(d, eps=0.5)
    x, y = _pairs()
    with torch.no_grad():
        plain = component_rates.plain_rates(model, x, y)
    assert torch.allclose(component_rates.rate_tensor(model, x, y), plain, rtol=1e-4, atol=1e-6)


def test_fc2_zero_lift_uses_the_first_d_columns(demo):
    x, y = _pairs(2)
    fc2 = demo.blocks[0].mlp.fc2
    ex, ey = component_rates.embed(demo, x), component_rates.embed(demo, y)
    lifted = torch.cat([ex - ey, torch.zeros(*ex.shape[:2], fc2.in_features - ex.shape[-1])], dim=-1)
    expected = torch.linalg.vector_norm((lifted @ fc2.weight.T).flatten(1), dim=1) / torch.linalg.vector_norm(
        (ex - ey).flatten(1), dim=1
    )
    fast = component_rates.rate_tensor(demo, x, y)[0, COMPONENTS.index("fc2")]
    assert torch.allclose(fast.float(), expected.detach(), rtol=1e-4)


def test_batch_size_independence(demo):
    x, y = _pairs(8)
    whole = component_rates.rate_tensor(demo, x, y)
    halves = torch.cat(
        [component_rates.rate_tensor(demo, x[:3], y[:3]), component_rates.rate_tensor(demo, x[3:], y[3:])], dim=2
    )
    assert torch.allclose(whole, halves, rtol=1e-5)


def test_rates_are_finite(demo):
    x, _ = _pairs(2)
    r = component_rates.rate_tensor(demo, x, x.flip(0))
    assert torch.isfinite(r).all()


def _in_situ_by_hand(model, x, y):
    """A hand-written pre-norm forward pass, recording each component's input and output."""

    def seq(images):
        h = model._pos_embed(model.patch_embed(images))
        records = []
        for block in model.blocks:
            n1 = torch.nn.functional.layer_norm(
                h, (h.shape[-1],), block.norm1.weight, block.norm1.bias, block.norm1.eps
            )
            qkv = (
                block.attn.qkv(n1).reshape(n1.shape[0], n1.shape[1], 3, block.attn.num_heads, -1).permute(2, 0, 3, 1, 4)
            )
            q, k, v = qkv[0], qkv[1], qkv[2]
            weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
            a = block.attn.proj((weights @ v).transpose(1, 2).reshape(n1.shape))
            h2 = h + a
            n2 = torch.nn.functional.layer_norm(
                h2, (h.shape[-1],), block.norm2.weight, block.norm2.bias, block.norm2.eps
            )
            hidden = block.mlp.fc1(n2)
            act = torch.nn.functional.gelu(hidden)
            m = block.mlp.fc2(act)
            records.append({"ln1": (h, n1), "mha": (n1, a), "ln2": (h2, n2), "fc1": (n2, hidden), "fc2": (act, m)})
            h = h2 + m
        return records

    rx, ry = seq(x), seq(y)
    norm = lambda t: torch.linalg.vector_norm(t.flatten(1), dim=1)  # noqa: E731
    return torch.stack(
        [
            torch.stack([norm(bx[c][1] - by[c][1]) / norm(bx[c][0] - by[c][0]) for c in COMPONENTS])
            for bx, by in zip(rx, ry)
        ]
    )


def test_in_situ_matches_a_hand_written_forward_pass(demo):
    x, y = _pairs(4)
    with torch.no_grad():
        expected = _in_situ_by_hand(demo, x, y)
    ours = component_rates.rate_tensor(demo, x, y, inputs="in_situ")
    assert torch.allclose(ours.float(), expected, rtol=1e-4)
    assert not torch.allclose(ours, component_rates.rate_tensor(demo, x, y))  # a different quantity


def test_tidy_table_and_summaries(demo):
    x, y = _pairs(3)
    table = plasticity.rates(demo, x, y)
    blocks = len(demo.blocks)
    assert list(table.columns) == ["block", "depth", "component", "pair", "rate"]
    assert len(table) == blocks * 5 * 3
    assert table["depth"].min() == 0 and table["depth"].max() == 100
    assert set(table["component"]) == set(COMPONENTS) and set(table["pair"]) == {0, 1, 2}
    row = table[(table.block == 2) & (table.component == "fc1") & (table.pair == 1)]["rate"].item()
    assert row == pytest.approx(component_rates.rate_tensor(demo, x, y)[2, COMPONENTS.index("fc1"), 1].item())
    by_block = plasticity_table.plasticity_by_block(table)
    assert by_block.shape == (blocks, 5) and list(by_block.columns) == list(COMPONENTS)
    ranked = plasticity_table.ranked(table)
    assert sorted(ranked["rank"]) == [1, 2, 3, 4, 5]
    assert ranked["plasticity"].is_monotonic_decreasing


def test_bad_inputs(tiny_vit):
    model = tiny_vit()
    x, y = _pairs(2)
    with pytest.raises(ValueError, match="valid inputs: embedding, in_situ"):
        plasticity.rates(model, x, y, inputs="forward")
    with pytest.raises(ValueError, match="same shape"):
        plasticity.rates(model, x, y[:1])
    assert components.COMPONENTS == COMPONENTS


def test_measure_streams_pairs_and_matches_rates(demo, tmp_path):
    from torch.utils.data import TensorDataset

    x, y = _pairs(10)
    reference, target = TensorDataset(x, torch.zeros(10)), TensorDataset(y, torch.zeros(10))
    table = plasticity.measure(demo, reference, target, n_pairs=7, running=Running(batch_size=3, progress=False))
    direct = plasticity.rates(demo, x[:7], y[:7])
    assert sorted(table["pair"].unique()) == list(range(7))
    merged = table.merge(direct, on=["block", "component", "pair"])
    assert (
        len(merged) == len(direct) and (merged["rate_x"] - merged["rate_y"]).abs().max() < 1e-6 * merged["rate_y"].max()
    )
    with pytest.raises(ValueError, match=r"n_pairs must be in 1..10 with sample 'once'"):
        plasticity.measure(demo, reference, target, n_pairs=11, draw=PairDraw("once"), running=Running(progress=False))
    # how pairs are drawn and how it runs are values checked when they are made, before any work
    with pytest.raises(ValueError, match="valid samples: first, once, random"):
        PairDraw("twice")
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        Running(batch_size=0)

    folder = plasticity_table.save(table, Measurement(), found(table))
    back = plasticity_table.load(folder)
    assert back["component"].cat.categories.tolist() == list(COMPONENTS)
    assert (back["rate"] - table["rate"]).abs().max() < 1e-9 and back["pair"].tolist() == table["pair"].tolist()
    with pytest.raises(FileNotFoundError, match="metadata.json"):
        plasticity_table.load(tmp_path / "nothing")


def test_result_folders_name_model_dataset_and_inputs(monkeypatch, tmp_path, move_results):
    move_results(".")
    assert Measurement("demo", "digits_c/snow").folder() == tmp_path / "plasticity" / "demo" / "digits_c" / "snow"
    in_situ = Measurement("demo", "digits", inputs="in_situ")
    assert in_situ.folder() == tmp_path / "plasticity_in_situ" / "demo" / "digits"


def test_plasticity_benchmark_runs(capsys):
    from benchmarks import __main__ as bench

    bench.main(["plasticity", "--pairs", "8", "--batch-size", "4", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "plain_pairs_per_s" in out and "measure_pairs_per_s" in out


def test_run_saves_a_result_and_decodes_with_workers_only_on_a_gpu(monkeypatch, tmp_path, move_results):
    move_results(".")
    workers = []
    original = plasticity.measure

    def spy(*args, running, **kwargs):
        workers.append(running.num_workers)
        return original(*args, running=running, **kwargs)

    monkeypatch.setattr(plasticity, "measure", spy)
    table, folder = plasticity.run(Measurement(n_pairs=8), batch_size=4, progress=False)
    assert (
        folder == tmp_path / "plasticity" / "demo" / "digits"
        and len(plasticity_table.load(folder)) == len(table) == 8 * 6 * 5
    )
    plasticity.run(Measurement(n_pairs=4), batch_size=4, progress=False, num_workers=2)
    assert workers == [0, 2]
    monkeypatch.setattr(plasticity, "measure", lambda *a, running, **k: workers.append(running.num_workers) or table)
    monkeypatch.setattr(plasticity.devices, "check_device", lambda device: torch.device(device))  # as if with a GPU
    plasticity.run(Measurement(n_pairs=4), batch_size=4, device="cuda", progress=False)
    assert workers[-1] >= 1


def test_a_run_records_the_token_rms_and_the_identical_pairs(monkeypatch, tmp_path, move_results):
    import json

    move_results(".")
    table, folder = plasticity.run(Measurement(n_pairs=6), batch_size=4, progress=False)
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["identical_pairs_excluded"] == 0 and metadata["token_rms"] == table.attrs["token_rms"] > 0
    network, x, y = plasticity.pair_images(Measurement(n_pairs=6))
    assert metadata["token_rms"] == pytest.approx(plasticity.rates(network, x, y).attrs["token_rms"], rel=1e-9)
    assert plasticity_table.load(folder).attrs["token_rms"] == metadata["token_rms"]
    collected = plasticity_table.collect()
    assert collected["token_rms"].tolist() == [metadata["token_rms"]] * 5
    # a dataset against itself, paired by position: every pair identical, nothing to measure
    with pytest.raises(ValueError, match="all 4 pairs have identical embeddings"):
        plasticity.run(Measurement(reference="digits", n_pairs=4), batch_size=4, progress=False)
    # a result whose record lacks a name today's holds (saved before it was recorded): outdated, measured again
    rms = metadata.pop("token_rms")
    storage.write_json(folder / "metadata.json", metadata)
    assert not Measurement(n_pairs=6).is_saved()
    with pytest.warns(UserWarning, match="records left out"):
        assert plasticity_table.collect().empty
    assert plasticity.measure_missing([Measurement(n_pairs=6)], batch_size=4) == [Measurement(n_pairs=6)]
    assert plasticity_table.collect()["token_rms"].tolist() == [rms] * 5


def test_a_run_asking_for_more_pairs_than_a_test_split_has_measures_them_all_and_once_uses_each_image_once(
    tmp_path, monkeypatch, move_results
):
    # the paper's 12,800 pairs against test splits of 2,000 (Cifar10-C) to 3,669 (Pets) images
    from paperlib.data import datasets

    move_results(".")
    asked = []
    measured = component_rates.to_table(torch.ones(6, 5, 1))
    measured.attrs.update(token_rms=1.0, identical_pairs_excluded=0)
    monkeypatch.setattr(plasticity, "measure", lambda model, x, y, n_pairs, *a, **k: asked.append(n_pairs) or measured)
    monkeypatch.setattr(plasticity, "save", lambda table, measurement, facts: measurement.metadata(facts))
    available = min(len(datasets.get_dataset(name, "test")) for name in ("digits", "digits_source"))
    _, metadata = plasticity.run(Measurement(n_pairs=12800), progress=False)
    assert asked == [12800] and metadata["n_pairs"] == metadata["n_pairs_requested"] == 12800  # the authors' pairs
    _, metadata = plasticity.run(Measurement(n_pairs=12800, sample="once"), progress=False)
    assert asked[-1] == available and metadata["n_pairs"] == available and metadata["n_pairs_requested"] == 12800
    assert metadata["distinct_reference"] == metadata["distinct_target"] == available
    _, metadata = plasticity.run(Measurement(n_pairs=5, sample="once"), progress=False)
    assert asked[-1] == 5 and metadata["n_pairs"] == metadata["n_pairs_requested"] == 5
    assert Measurement(sample="once").folder().name == "digits+once"


def authors_loader(n_images: int, batch: int):
    """The authors' analysis loader, built from torch's own DataLoader: unshuffled, ``drop_last``, made endless."""
    from itertools import chain, repeat

    from torch.utils.data import DataLoader

    return chain.from_iterable(repeat(DataLoader(torch.arange(n_images), batch_size=batch, drop_last=True)))


@pytest.mark.parametrize("batch, steps", [(64, 200), (32, 400)])  # ViT-Base's; ViT-Large's and ViT-Huge's
def test_the_pairs_are_those_of_two_cycled_loaders_with_drop_last(batch, steps):
    reference, target = authors_loader(50_000, batch), authors_loader(2_000, batch)  # ImageNet val, Cifar10-C test
    expected = [torch.cat([next(loader) for _ in range(steps)]).tolist() for loader in (reference, target)]
    drawn = plasticity.pair_indices(50_000, 2_000, batch * steps, batch=batch)
    assert list(drawn) == expected
    assert drawn[0] == list(range(12_800)) and len(set(drawn[1])) == 1_984  # 31 whole batches of 64, 62 of 32


@pytest.mark.parametrize(
    "model, batch", [("vit_base_in21k", 64), ("vit_large_in21k", 32), ("vit_huge_in21k", 32), ("demo", 64)]
)
def test_the_loader_batch_is_by_default_the_one_the_authors_analysis_gives_each_model(model, batch):
    # apps/vit/scripts/analysis.sh: batch_size=64, n_steps=200 for ViT-Base; 32 and 400 for ViT-Large and ViT-Huge
    assert Measurement(model, "cifar10", n_pairs=12_800).loader_batch == batch
    assert Measurement(model, "cifar10", n_pairs=12_800, loader_batch=16).loader_batch == 16  # asked: kept


def test_the_demo_world_measures_the_pairs_asked_for_with_both_sides_cycled(move_results):
    move_results(".")
    asked = measurements.DEMO_PAIRS + 40
    measurement = Measurement(n_pairs=asked)
    table, folder = plasticity.run(measurement, batch_size=64, progress=False)
    metadata = json.loads((folder / "metadata.json").read_text())
    whole = [len(datasets.get_dataset(name, "test")) // 64 * 64 for name in ("digits_source", "digits")]
    assert metadata["n_pairs"] == table["pair"].nunique() == asked and metadata["n_pairs_requested"] == asked
    assert [metadata["distinct_reference"], metadata["distinct_target"]] == whole == [128, 128]
    # pair 128 is pair 0 again: the same two images, the same rates
    rates = table.set_index(["pair", "block", "component"])["rate"]
    assert (rates.loc[128] - rates.loc[0]).abs().max() < 1e-6
    # the reference's first images, in order
    reference = datasets.get_dataset("digits_source", "test", image_size=32, mean_std=models.normalization("demo"))
    _, x, _ = plasticity.pair_images(measurement)
    assert len(x) == asked and torch.equal(x[130], reference[2][0]) and torch.equal(x[5], reference[5][0])
    # the same pairs by index, for the bootstrap: pair 128 repeats pair 0's images, so images are resampled, not pairs
    reference_ids, target_ids = plasticity.pair_ids(measurement)
    assert len(reference_ids) == len(target_ids) == asked and (reference_ids[130], reference_ids[5]) == (2, 5)
    uncertainty = ranking.ranking_uncertainty(table, n_resamples=50, images=(reference_ids, target_ids))
    assert uncertainty.attrs["resampled"] == "pairs of images"
    collected = plasticity_table.collect().iloc[0]
    assert (collected["n_pairs"], collected["distinct_reference"], collected["distinct_target"]) == (asked, 128, 128)


def test_a_small_test_split_in_the_official_format_repeats(tmp_path, move_results):
    from paperlib.data import fixtures

    move_results(".")
    root = tmp_path / "data"
    fixtures.write_cifar10c(root, ("contrast",), per_severity=50)  # a 10-image test split
    fixtures.write_imagenet(root)  # 12 validation images: both sets smaller than one batch, used whole
    measurement = Measurement("demo", "cifar10c/contrast", n_pairs=30)
    table, folder = plasticity.run(measurement, batch_size=8, data_root=root, progress=False)
    metadata = json.loads((folder / "metadata.json").read_text())
    assert (metadata["n_pairs"], metadata["distinct_reference"], metadata["distinct_target"]) == (30, 12, 10)
    rates = table.set_index(["pair", "block", "component"])["rate"]
    assert (rates.loc[20] - rates.loc[0]).abs().max() > 0  # image 0 of the target with another reference image
    once_each = dataclasses.replace(measurement, sample="once")
    once, _ = plasticity.run(once_each, batch_size=8, data_root=root, progress=False)
    assert once["pair"].nunique() == 10


def test_pair_indices_first_and_random():
    assert plasticity.pair_indices(10, 8, 5) == (list(range(5)), list(range(5)))
    reference, target = plasticity.pair_indices(10, 8, 6, "random", seed=3)
    assert len(set(reference)) == len(set(target)) == 6 and max(reference) < 10 and max(target) < 8
    assert plasticity.pair_indices(10, 8, 6, "random", seed=3) == (reference, target)  # the seed fixes the draw
    assert plasticity.pair_indices(10, 8, 6, "random", seed=4) != (reference, target)
    many = plasticity.pair_indices(1000, 1000, 500, "random", seed=0)
    assert many[0] != many[1] and max(many[0]) > 900  # two draws, from the whole sets
    assert (
        plasticity.pair_indices(1000, 50, 40, "random", seed=0)[1]
        == plasticity.pair_indices(70, 50, 40, "random", seed=0)[1]
    )  # a set's draw is its own
    with pytest.raises(ValueError, match="valid samples: first, once, random"):
        plasticity.pair_indices(10, 8, 5, "shuffled")
    with pytest.raises(ValueError, match=r"n_pairs must be in 1..8"):
        plasticity.pair_indices(10, 8, 9, "random")


def test_random_pairs_are_the_drawn_images_paired(demo):
    from torch.utils.data import Subset, TensorDataset

    x, y = _pairs(12)
    model, reference, target = demo, TensorDataset(x, torch.zeros(12)), TensorDataset(y[:10], torch.zeros(10))
    drawn_reference, drawn_target = plasticity.pair_indices(len(reference), len(target), 6, "random", seed=7)
    quietly = Running(batch_size=4, progress=False)
    drawn = plasticity.measure(model, reference, target, 6, draw=PairDraw("random", seed=7), running=quietly)
    by_hand = plasticity.measure(
        model, Subset(reference, drawn_reference), Subset(target, drawn_target), 6, running=quietly
    )
    assert drawn["rate"].tolist() == by_hand["rate"].tolist()
    first = plasticity.measure(model, reference, target, 6, running=quietly)
    assert drawn["rate"].tolist() != first["rate"].tolist()


def test_random_draws_are_saved_apart_and_collected_on_request(monkeypatch, tmp_path, move_results):
    move_results(".")
    _, first = plasticity.run(Measurement(n_pairs=4), batch_size=4, progress=False)
    _, drawn = plasticity.run(Measurement(n_pairs=4, sample="random", seed=3), batch_size=4, progress=False)
    assert first == tmp_path / "plasticity" / "demo" / "digits"
    assert (
        drawn
        == Measurement(sample="random", seed=3).folder()
        == tmp_path / "plasticity" / "demo" / "digits+random-seed=3"
    )
    assert len(plasticity_table.collect()) == 5 and set(plasticity_table.collect()["sample"]) == {
        "first"
    }  # the paper's draw only, by default
    assert plasticity_table.collect(sample="random")["seed"].tolist() == [3] * 5
    assert (
        plasticity_table.collect()["seed"].isna().all()
        and str(plasticity_table.collect(sample=None)["seed"].dtype) == "Int64"
    )
    assert plasticity_table.collect(sample="random", seed=4).empty
    assert len(plasticity_table.collect(sample=None)) == 10


def test_a_result_against_other_reference_images_is_kept_beside_the_default_one(monkeypatch, tmp_path, move_results):
    move_results(".")
    assert measurements.default_reference("digits_c/snow") == "digits_source"
    # the demo's datasets by family, as the data registry groups them
    demo = {name for name, source in datasets.DATASETS.items() if source.group == "demo"}
    assert demo == {name for name in datasets.DATASETS if names.family(name) in names.DEMO_FAMILIES} and len(demo) > 2
    assert measurements.default_reference("cifar10") == measurements.default_reference("custom/anything") == "imagenet"
    default, default_folder = plasticity.run(
        Measurement("demo", "digits_c/snow", n_pairs=6), batch_size=4, progress=False
    )
    other, other_folder = plasticity.run(
        Measurement("demo", "digits_c/snow", "digits", n_pairs=6), batch_size=4, progress=False
    )
    assert default_folder == tmp_path / "plasticity" / "demo" / "digits_c" / "snow"
    assert (
        other_folder
        == default_folder.with_name("snow+ref-digits")
        == Measurement("demo", "digits_c/snow", reference="digits").folder()
    )
    assert Measurement("demo", "digits_c/snow", reference="digits_source").folder() == default_folder
    assert plasticity_table.load(default_folder)["rate"].tolist() == default["rate"].tolist()  # not replaced
    assert other["rate"].tolist() != default["rate"].tolist()
    assert set(plasticity_table.collect()["reference"]) == {"digits_source"}
    assert set(plasticity_table.collect(reference="digits")["reference"]) == {"digits"}
    assert len(plasticity_table.collect(reference=None)) == 10


def test_another_cifar10c_severity_gets_a_folder_of_its_own(monkeypatch, tmp_path, move_results):
    move_results(".")
    five = Measurement("demo", "cifar10c/snow").folder()
    assert Measurement("demo", "cifar10c/snow", severity=5).folder() == five
    assert Measurement("demo", "cifar10c/snow", severity=3).folder() == five.with_name("snow+severity-3")
    # the demo's corruptions have one severity
    assert Measurement("demo", "digits_c/snow", severity=3).folder() == Measurement("demo", "digits_c/snow").folder()


def test_a_result_saved_before_its_record_held_a_key_or_its_blocks_is_measured_again_one_before_checksums_kept(
    move_results,
):
    move_results(".")
    measurement = Measurement(n_pairs=4)
    _, folder = plasticity.run(measurement, batch_size=4, progress=False)
    record = json.loads((folder / measurements.METADATA).read_text())
    assert set(measurements.KEY + measurements.FOUND) <= record.keys() and measurement.is_saved()
    for older in ("reference", "sample", "normalize", "severity", "distinct_target", "blocks"):
        if older == "blocks":  # saved before the P(f) per block was: no file, none in the record
            (folder / measurements.BLOCKS).unlink()
            written = record | {"files": {measurements.RATES: record["files"][measurements.RATES]}}
        else:
            written = {name: value for name, value in record.items() if name != older}
        storage.write_json(folder / measurements.METADATA, written)
        assert not measurement.is_saved(), older
        with pytest.warns(UserWarning, match="records left out"):
            assert plasticity_table.collect(sample=None, normalize=None, reference=None, severity=None).empty
        assert plasticity.measure_missing([measurement], batch_size=4) == [measurement]
        assert measurement.is_saved() and len(plasticity_table.collect()) == 5
        record = json.loads((folder / measurements.METADATA).read_text())
    # saved before checksums were: the sizes of its files alone; the tables read it, so it is kept as it is
    sizes = {name: kept["bytes"] for name, kept in record["files"].items()}
    written = {name: value for name, value in record.items() if name not in ("record", "sha256")} | {"files": sizes}
    (folder / measurements.METADATA).write_text(json.dumps(written))
    assert measurement.is_saved()
    with pytest.warns(UserWarning, match=r"read as they are: .*\(record 1\)"):
        assert len(plasticity_table.collect()) == 5


def test_a_result_of_earlier_splits_is_kept_read_and_measured_again_only_when_asked(move_results, monkeypatch):
    move_results(".")
    measurement = Measurement(n_pairs=4)
    _, folder = plasticity.run(measurement, batch_size=4, progress=False)
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["splits"] == names.SPLITS_VERSION and measurement.is_saved()
    del metadata["splits"]  # a result from before the authors' splits
    storage.write_json(folder / "metadata.json", metadata)
    assert measurement.is_saved()  # a user's result: kept
    with pytest.warns(UserWarning, match=r"written by an older version, read as they are: .*digits \(splits 1\)"):
        assert len(plasticity_table.collect()) == 5
    monkeypatch.setenv(paths.RETRAIN_OLDER, "1")
    assert not measurement.is_saved()
    assert plasticity.measure_missing([measurement], batch_size=4) == [measurement]
    assert measurement.is_saved() and len(plasticity_table.collect()) == 5
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["pairs"] == measurements.VERSION["pairs"] == 2
    del metadata["pairs"]  # a result of each image once, before the authors' pair set
    storage.write_json(folder / "metadata.json", metadata)
    assert not measurement.is_saved()
    monkeypatch.delenv(paths.RETRAIN_OLDER)
    with pytest.warns(UserWarning, match=r"\(pairs 1\)"):
        assert len(plasticity_table.collect()) == 5


def test_measure_missing_measures_a_missing_result_and_skips_a_present_one(monkeypatch, tmp_path, move_results):
    move_results(".")
    calls = []
    original = plasticity.run
    monkeypatch.setattr(
        plasticity, "run", lambda *args, **kwargs: calls.append((args, kwargs)) or original(*args, **kwargs)
    )
    clean, snow = Measurement(n_pairs=4), Measurement(dataset="digits_c/snow", n_pairs=6)
    assert not clean.is_saved()
    assert plasticity.measure_missing([clean], batch_size=4) == [clean]
    assert clean.is_saved() and len(plasticity_table.load(clean.folder())) == 4 * 6 * 5
    assert not Measurement(sample="random").is_saved()  # another draw is another result
    # run gets the measurement and run's options as given
    assert calls == [((clean,), {"batch_size": 4, "device": "cpu", "data_root": None, "progress": False})]
    first = plasticity_table.load(clean.folder())["rate"].tolist()
    # present: skipped, and not replaced, whatever number of pairs it asks for; missing: measured, in order
    assert plasticity.measure_missing([Measurement(n_pairs=6), snow], batch_size=4) == [snow]
    assert plasticity_table.load(clean.folder())["rate"].tolist() == first and len(calls) == 2
    assert snow.is_saved() and plasticity_table.load(snow.folder())["pair"].nunique() == 6
    assert plasticity.measure_missing([clean, snow]) == [] and len(calls) == 2
    assert len(plasticity_table.collect()) == 10


def test_measure_missing_looks_for_the_result_it_would_measure(monkeypatch, tmp_path, move_results):
    move_results(".")
    calls = []
    monkeypatch.setattr(plasticity, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    saved = component_rates.to_table(torch.ones(6, 5, 4))
    plasticity_table.save(saved, Measurement(), found(saved))
    # another reference, draw, normalisation or inputs is another result: measured, with run's options as given
    others = [
        Measurement(reference="digits"),
        Measurement(sample="random", seed=3, n_pairs=5),
        Measurement(normalize="model", inputs="in_situ"),
    ]
    assert plasticity.measure_missing(others) == others
    assert plasticity.measure_missing(others[1:2], device="cuda", data_root="elsewhere", progress=True) == others[1:2]
    options = {"batch_size": 64, "device": "cpu", "data_root": None, "progress": False}
    assert calls == [((measurement,), options) for measurement in others] + [
        ((others[1],), {**options, "device": "cuda", "data_root": "elsewhere", "progress": True})
    ]
    # the default reference, however it is written, is the saved one
    assert (
        plasticity.measure_missing([Measurement(), Measurement(reference="digits_source"), Measurement(reference=None)])
        == []
    )


def test_a_measurement_is_validated_when_it_is_made():
    for fields, message in [
        ({"model": "vit_nothing"}, "unknown model 'vit_nothing'; valid short names: vit_base_in21k"),
        ({"dataset": "digits_c/nowhere"}, "unknown dataset 'digits_c/nowhere'; valid datasets: digits_source"),
        ({"reference": "imagenet21k"}, "unknown dataset 'imagenet21k'"),
        ({"inputs": "forward"}, "valid inputs: embedding, in_situ"),
        ({"sample": "all"}, "valid samples: first, once, random"),
        ({"normalize": "own"}, "valid choices: imagenet, model"),
        ({"severity": 6}, r"severity must be one of \(1, 2, 3, 4, 5\), got 6"),
        ({"n_pairs": 0}, "n_pairs must be at least 1 \\(an integer\\), got 0"),
        ({"n_pairs": 12.5}, "n_pairs must be at least 1 \\(an integer\\), got 12.5"),
        ({"seed": -1}, "seed must be at least 0 \\(an integer\\), got -1"),
        ({"seed": True}, "seed must be at least 0 \\(an integer\\), got True"),
    ]:
        with pytest.raises(ValueError, match=message):
            Measurement(**fields)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Measurement().n_pairs = 5
    # one measurement, one value: the default reference written any way
    assert (
        Measurement()
        == Measurement(reference="")
        == Measurement(reference=None)
        == Measurement("demo", "digits", "digits_source")
    )
    assert Measurement(dataset="cifar10").reference == Measurement(dataset="custom/xrays").reference == "imagenet"


def test_measurements_defaults_are_notebook_02s_and_every_notebook_has_the_demos_pairs():
    notebook = specs.notebook_parameters(paths.NOTEBOOKS / "02_plasticity.ipynb")
    assert (
        Measurement(
            **{field.name: notebook[field.name] for field in dataclasses.fields(Measurement) if field.name in notebook}
        )
        == Measurement()
    )
    assert {field.name for field in dataclasses.fields(Measurement)} - set(notebook) == {"severity"}
    # the demo's pairs: every image of the smaller test split
    assert measurements.DEMO_PAIRS == min(
        len(datasets.get_dataset(name, "test")) for name in ("digits", "digits_source")
    )
    for name, parameter in [
        ("01_theory_bounds", "n_images"),
        ("02_plasticity", "n_pairs"),
        ("03_plasticity_summary", "n_pairs"),
        ("06_gradient_dynamics", "n_pairs"),
        ("07_finetune_results", "n_pairs"),
        ("08_your_own_vit_and_data", "n_pairs"),
        ("09_lora_by_plasticity", "n_pairs"),
    ]:
        assert specs.notebook_parameters(paths.NOTEBOOKS / f"{name}.ipynb")[parameter] == measurements.DEMO_PAIRS, name


def _with_identical_pairs(n=6, size=32, seed=0, identical=(1, 4)):
    x, y = _pairs(n, size, seed)
    y[list(identical)] = x[list(identical)]
    return x, y


def test_identical_pairs_are_excluded_with_a_warning_and_counted(demo):
    x, y = _with_identical_pairs()
    with torch.no_grad():
        assert component_rates.rate_tensor(demo, x, y)[:, :, [1, 4]].isnan().all()  # 0/0 in the raw tensor
    with pytest.warns(ranking.IdenticalPairsWarning, match="2 of 6 pairs excluded"):
        table = plasticity.rates(demo, x, y)
    assert table.attrs["identical_pairs_excluded"] == 2 and table["rate"].notna().all()
    assert sorted(table["pair"].unique()) == [0, 2, 3, 5]  # the other pairs keep their numbers
    # and their exact rates: those of the same pairs measured alone
    alone = plasticity.rates(demo, x[[0, 2, 3, 5]], y[[0, 2, 3, 5]])
    assert alone.attrs["identical_pairs_excluded"] == 0
    assert table["rate"].tolist() == pytest.approx(alone["rate"].tolist(), rel=1e-6)
    assert table.attrs["token_rms"] == pytest.approx(alone.attrs["token_rms"], rel=1e-6)
    with pytest.raises(ValueError, match="all 2 pairs have identical embeddings"):
        plasticity.rates(demo, x[:2], x[:2])


def test_measure_excludes_identical_pairs_across_batches(demo):
    from torch.utils.data import TensorDataset

    x, y = _with_identical_pairs(10, identical=(0, 4, 9))
    reference, target = TensorDataset(x, torch.zeros(10)), TensorDataset(y, torch.zeros(10))
    with pytest.warns(ranking.IdenticalPairsWarning, match="3 of 10 pairs excluded"):
        table = plasticity.measure(demo, reference, target, n_pairs=10, running=Running(batch_size=4, progress=False))
    assert table.attrs["identical_pairs_excluded"] == 3 and sorted(table["pair"].unique()) == [1, 2, 3, 5, 6, 7, 8]
    with pytest.warns(ranking.IdenticalPairsWarning):
        direct = plasticity.rates(demo, x, y)
    assert table["rate"].tolist() == pytest.approx(direct["rate"].tolist(), rel=1e-6)


def test_token_rms_is_the_root_mean_square_norm_of_the_measured_tokens(demo):
    from paperlib.measure import bounds

    x, y = _with_identical_pairs(identical=(2,))
    with pytest.warns(ranking.IdenticalPairsWarning):
        table = plasticity.rates(demo, x, y)
    kept = [0, 1, 3, 4, 5]  # the identical pair's tokens are not measured, so not counted
    with torch.no_grad():
        tokens = torch.cat([component_rates.embed(demo, x[kept]), component_rates.embed(demo, y[kept])]).double()
    expected = tokens.square().sum(-1).mean().sqrt().item()
    assert table.attrs["token_rms"] == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(bounds.token_radius(demo, torch.cat([x[kept], y[kept]])), rel=1e-9)
    scaled = plasticity.rates(demo, x[kept], y[kept], scale=4.0)
    assert scaled.attrs["token_rms"] == pytest.approx(4 * expected, rel=1e-9)


def test_summaries_leave_out_pairs_without_rates(demo):
    # a table made from the raw tensor still has the identical pairs' NaN rates
    x, y = _with_identical_pairs()
    with torch.no_grad():
        raw = component_rates.to_table(component_rates.rate_tensor(demo, x, y))
    assert raw["rate"].isna().any()
    with pytest.warns(ranking.IdenticalPairsWarning, match="2 pairs without any rate"):
        ranked = plasticity_table.ranked(raw)
    with pytest.warns(ranking.IdenticalPairsWarning):
        by_block = plasticity_table.plasticity_by_block(raw)
    clean = plasticity.rates(demo, x[[0, 2, 3, 5]], y[[0, 2, 3, 5]])
    assert ranked["plasticity"].to_numpy() == pytest.approx(plasticity_table.ranked(clean)["plasticity"].to_numpy())
    assert by_block.to_numpy() == pytest.approx(plasticity_table.plasticity_by_block(clean).to_numpy())


SCALE_FACTORS = [0.25, 1.0, 4.0, 16.0]
"""Factors at which the LayerNorms' eps (1e-6) is negligible: on these pairs the demo's tokens have
a median variance (over channels) of about 0.3 at factor 1, so about 0.02 at 0.25, where eps moves
LN P(f) times the factor by about 3e-5 relative; at 0.01 it moves it by 2%, at 0.001 by half."""


@pytest.fixture(scope="module")
def scale_curve():
    model = models.create_model("demo")
    x, y = _pairs(8)
    return plasticity.scale_curve(model, x, y, SCALE_FACTORS, batch_size=3)


def test_scale_curve_linear_components_are_flat(scale_curve):
    assert list(scale_curve.columns[:3]) == ["factor", "component", "plasticity"]
    assert len(scale_curve) == len(SCALE_FACTORS) * 5
    wide = scale_curve.pivot_table(index="factor", columns="component", values="plasticity", observed=True)
    assert list(wide.index) == SCALE_FACTORS
    for component in ("fc1", "fc2"):
        values = wide[component].to_numpy()
        assert (values.max() - values.min()) / values.mean() < 1e-5, component
    # the embedding really is scaled: the others move
    assert wide["mha"].max() / wide["mha"].min() > 1.01


def test_scale_curve_layer_norms_fall_as_one_over_the_factor(scale_curve):
    wide = scale_curve.pivot_table(index="factor", columns="component", values="plasticity", observed=True)
    for component in ("ln1", "ln2"):
        scaled = wide[component].to_numpy() * wide.index.to_numpy()
        assert (scaled.max() - scaled.min()) / scaled.mean() < 1e-3, component
        assert wide[component].iloc[0] / wide[component].iloc[-1] == pytest.approx(64, rel=1e-3)
    rms = scale_curve.groupby("factor")["token_rms"].first()
    assert (rms / rms.index).to_numpy() == pytest.approx([rms[1.0]] * len(SCALE_FACTORS), rel=1e-9)


def test_scale_curve_at_factor_one_is_the_ranking_and_uses_the_same_rates():
    model = models.create_model("demo")
    x, y = _pairs(5)
    curve = plasticity.scale_curve("demo", x, y, [1.0, 2.0])
    ranked = plasticity_table.ranked(plasticity.rates(model, x, y)).rename(index=lambda label: label.lower())
    at_one = curve[curve.factor == 1.0].set_index("component")["plasticity"]
    assert at_one.to_numpy() == pytest.approx(ranked.loc[list(COMPONENTS), "plasticity"].to_numpy(), rel=1e-9)
    twice = plasticity.rates(model, x, y, scale=2.0)
    with torch.no_grad():
        plain = component_rates.plain_rates(model, 2 * x, 2 * y)  # the patch embedding is affine, not linear
    assert not torch.allclose(plain, component_rates.rate_tensor(model, x, y, scale=2.0))
    at_two = curve[curve.factor == 2.0].set_index("component")["plasticity"]
    assert at_two.to_numpy() == pytest.approx(
        twice.groupby("component", observed=True)["rate"].mean()[list(COMPONENTS)].to_numpy(), rel=1e-9
    )
    with pytest.raises(ValueError, match="scale must be a positive"):
        plasticity.rates(model, x, y, scale=0.0)
    with pytest.raises(ValueError, match="scale applies to the embedding"):
        plasticity.rates(model, x, y, inputs="in_situ", scale=2.0)


def test_scaled_rates_equal_the_plain_definition_on_scaled_embeddings(demo):
    x, y = _pairs(4)
    fast = component_rates.rate_tensor(demo, x, y, scale=3.0)
    with torch.no_grad():
        ex, ey = 3.0 * component_rates.embed(demo, x), 3.0 * component_rates.embed(demo, y)
        expected = []
        for block in demo.blocks:
            row = []
            for component in COMPONENTS:
                module = components.block_component(block, component)
                if component == "fc2":
                    pad = (0, module.in_features - ex.shape[-1])
                    fx, fy = module(torch.nn.functional.pad(ex, pad)), module(torch.nn.functional.pad(ey, pad))
                else:
                    fx, fy = module(ex), module(ey)
                norm = torch.linalg.vector_norm((fx - fy).flatten(1).double(), dim=1)
                row.append(norm / torch.linalg.vector_norm((ex - ey).flatten(1).double(), dim=1))
            expected.append(torch.stack(row))
    assert torch.allclose(fast, torch.stack(expected), rtol=1e-4, atol=1e-6)
