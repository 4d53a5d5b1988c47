"""The variable_images suite, run for real on a few generated photos (not timed: structure only)."""

import importlib.util
import sys
import tarfile

import numpy as np
import pytest

from tbl_bench.bench import run_bench
from tbl_bench.context import BenchContext, Sizes
from tbl_bench.suites import variable_images

pytest.importorskip("skimage", reason="the generated photos need tbl-bench[photos]")
pytest.importorskip("torch", reason="the PyTorch DataLoader baseline needs torch")

SUBSET = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("variable_images")
    mp = pytest.MonkeyPatch()
    mp.setattr(variable_images, "SUBSET_ROWS", SUBSET)  # fewer rows than the generated TAR holds
    try:
        ctx = BenchContext(tmp / "data", quick=True, peers=True, peer_python=sys.executable,
                           sizes=Sizes(images=9, classes=3, image_size=32, batch_size=4, scalar_rows=10,
                                       array_rows=10, warmup=1, epochs=1))
        doc = run_bench(["variable_images"], ctx, tmp / "results.json", rounds=1)
    finally:
        mp.undo()
    return ctx, doc


def test_every_tbl_storage_and_the_baseline_served_the_same_subset(run):
    ctx, doc = run
    entry = doc["suites"]["variable_images"]
    results = {r["name"]: r for r in entry["results"]}
    for name in ("tbl/jpeg256", "tbl/jpeg256-fastdct", "tbl/raw256", "tbl/fixed224", "pil/jpeg-tar"):
        assert results[name]["status"] == "ok", results[name]
        assert results[name]["items_per_epoch"] == SUBSET
        assert results[name]["throughput"] > 0
        assert results[name]["params"]["aug"] == "crop" and results[name]["params"]["size"] == 224
        assert results[name]["params"]["batch_size"] == 256 and results[name]["params"]["level"] == "consume"
    assert results["pil/jpeg-tar"]["role"] == "baseline"
    assert results["pil/jpeg-tar"]["params"]["workers"] == variable_images.THREADS
    assert all(results[f"tbl/{s}"]["params"]["threads"] == variable_images.THREADS
               for s in ("jpeg256", "jpeg256-fastdct", "raw256", "fixed224"))
    # the same JPEG file, served with each IDCT (the fast one is FFCV's)
    assert results["tbl/jpeg256-fastdct"]["params"]["path"] == results["tbl/jpeg256"]["params"]["path"]
    assert results["tbl/jpeg256-fastdct"]["params"]["jpeg_dct"] == "fast"
    assert "jpeg_dct" not in results["tbl/jpeg256"]["params"]
    assert "tbl jpeg256 vs pytorch-pil" in entry["ratios"]


def test_the_jpeg_decodes_and_their_ceiling_ran(run):
    """issue 38: the kernels' JPEG decode, today's thread-pool decode and simplejpeg decoding the same bytes
    alone (the ceiling), at both size caps."""
    _, doc = run
    entry = doc["suites"]["variable_images"]
    results = {r["name"]: r for r in entry["results"]}
    for size in (256, 512):
        fused, pooled, ceiling = (results[f"tbl/jpeg{size}"], results[f"tbl/jpeg{size}-threads"],
                                  results[f"decode/jpeg{size}"])
        for r in (fused, pooled, ceiling):
            assert r["status"] == "ok", r
            assert r["items_per_epoch"] == SUBSET and r["throughput"] > 0
        assert pooled["params"]["jpeg_decode"] == "threads" and pooled["params"]["path"] == fused["params"]["path"]
        assert ceiling["role"] == "ceiling" and ceiling["params"]["path"] == fused["params"]["path"]
        assert f"tbl jpeg{size} vs decode-only ceiling" in entry["ratios"]
        assert f"tbl jpeg{size} vs its thread-pool decode" in entry["ratios"]


def test_the_evaluation_transform_and_the_produce_levels_ran_on_both_decodes(run):
    """issue 38: the evaluation transform by the kernels' decode and by the thread-pool decode, and the
    kernels' decode at the produce level, each against the same ceiling."""
    _, doc = run
    entry = doc["suites"]["variable_images"]
    results = {r["name"]: r for r in entry["results"]}
    for size in (256, 512):
        fused, pooled = results[f"tbl/jpeg{size}-eval"], results[f"tbl/jpeg{size}-threads-eval"]
        for r in (fused, pooled):
            assert r["status"] == "ok", r
            assert r["items_per_epoch"] == SUBSET and r["throughput"] > 0
            assert r["params"]["aug"] == "eval" and r["params"]["size"] == 224
            assert r["params"]["level"] == "consume" and r["params"]["path"] == results[f"tbl/jpeg{size}"]["params"]["path"]
        assert pooled["params"]["jpeg_decode"] == "threads" and fused["params"].get("jpeg_decode", "kernel") == "kernel"
        produce = results[f"tbl/jpeg{size}-produce"]
        assert produce["status"] == "ok" and produce["params"]["level"] == "produce"
        assert produce["params"]["aug"] == "crop" and produce["params"]["path"] == fused["params"]["path"]
        assert produce["params"].get("dtype", "float32") == "float32"
        u8 = results[f"tbl/jpeg{size}-u8-produce"]
        assert u8["status"] == "ok" and u8["items_per_epoch"] == SUBSET and u8["throughput"] > 0
        assert u8["params"]["dtype"] == "uint8" and u8["params"]["level"] == "produce"
        assert u8["params"]["aug"] == "crop" and u8["params"]["path"] == fused["params"]["path"]
        for label in (f"tbl jpeg{size} eval vs decode-only ceiling", f"tbl jpeg{size} eval vs its thread-pool decode",
                      f"tbl jpeg{size} at the produce level vs decode-only ceiling",
                      f"tbl jpeg{size} uint8 at the produce level vs decode-only ceiling"):
            assert label in entry["ratios"]


def test_the_eval_workload_serves_resize_then_center_crop(run):
    """tbl_serve(aug="eval") is the loader's Resize(round(size * 256 / 224)) + CenterCrop(size), no flip."""
    from tbl_bench.suites.images import tbl_serve
    from tbl_loader import ImageLoader

    _, doc = run
    results = {r["name"]: r for r in doc["suites"]["variable_images"]["results"]}
    path = results["tbl/jpeg256-eval"]["params"]["path"]
    workload = tbl_serve(path, batch_size=4, aug="eval", level="consume", size=24)
    direct = ImageLoader(path, 4, shuffle=True, seed=0, resize=27, center_crop=24)
    try:
        for loader in (workload.loader, direct):
            loader.set_epoch(1)
        pairs = list(zip(workload.loader, direct, strict=True))
        assert len(pairs) == 2  # SUBSET rows in batches of 4
        for got, want in pairs:
            assert tuple(got.images.shape) == (len(want.images), 3, 24, 24)
            assert np.array_equal(np.asarray(got.images), np.asarray(want.images))
    finally:
        workload.close()
        direct.close()
    with pytest.raises(ValueError, match="aug must be one of"):
        tbl_serve(path, batch_size=4, aug="center", level="consume", size=24)


def test_each_jpeg_store_is_compared_with_the_decode_of_its_own_bytes():
    """The report's "vs ceiling" pairs a configuration with the decode of its own store, whatever its level or
    transform; raw storage and FFCV's files have no ceiling; the PIL baseline stays RandomResizedCrop's."""
    from tbl_bench.compare import ratios

    def result(name, role, throughput, **params):
        return {"name": name, "role": role, "status": "ok", "throughput": throughput, "params": params}

    crop = {"aug": "crop", "level": "consume", "size": 224}
    results = [
        result("decode/jpeg256", "ceiling", 100.0, path="j256", aug=None, level=None, size=224),
        result("decode/jpeg512", "ceiling", 50.0, path="j512", aug=None, level=None, size=224),
        result("pil/jpeg-tar", "baseline", 10.0, tar="t", **crop),
        result("tbl/jpeg512", "subject", 40.0, path="j512", **crop),
        result("tbl/jpeg256-eval", "subject", 60.0, path="j256", **{**crop, "aug": "eval"}),
        result("tbl/jpeg256-produce", "subject", 80.0, path="j256", **{**crop, "level": "produce"}),
        result("tbl/raw256", "subject", 70.0, path="r256", **crop),
        result("ffcv/jpg256", "subject", 30.0, path="f.beton", **crop),
    ]
    suite = {"results": results, "compare_on": list(variable_images.COMPARE_ON)}
    got = {r["name"]: ratios(r, suite) for r in results if r["role"] == "subject"}
    assert got["tbl/jpeg512"]["ceiling"][:2] == ("decode/jpeg512", 0.8)
    assert got["tbl/jpeg256-eval"]["ceiling"][:2] == ("decode/jpeg256", 0.6)
    assert got["tbl/jpeg256-produce"]["ceiling"][:2] == ("decode/jpeg256", 0.8)
    assert "ceiling" not in got["tbl/raw256"] and "ceiling" not in got["ffcv/jpg256"]
    assert got["tbl/jpeg512"]["baseline"][:2] == ("pil/jpeg-tar", 4.0)
    assert got["ffcv/jpg256"]["baseline"][:2] == ("pil/jpeg-tar", 3.0)
    assert "baseline" not in got["tbl/jpeg256-eval"]  # the baseline serves RandomResizedCrop


def test_subset_tar_holds_the_first_rows_of_the_bench_tar(run, monkeypatch):
    ctx, _ = run
    monkeypatch.setattr(variable_images, "SUBSET_ROWS", SUBSET)
    with tarfile.open(ctx.image_tar()) as full, tarfile.open(variable_images.subset_tar(ctx)) as sub:
        full_files = [(m.name, full.extractfile(m).read()) for m in full if m.isfile()]
        sub_files = [(m.name, sub.extractfile(m).read()) for m in sub if m.isfile()]
    assert len(full_files) == 9 and sub_files == full_files[:SUBSET]


def test_ffcv_runs_or_is_skipped_with_its_import_error(run):
    _, doc = run
    results = {r["name"]: r for r in doc["suites"]["variable_images"]["results"]}
    for name in ("ffcv/jpg256", "ffcv/raw256", "ffcv/jpg512", "ffcv/jpg256-eval", "ffcv/jpg512-eval"):
        if importlib.util.find_spec("ffcv") is None:
            assert results[name]["status"] == "skipped"
            assert "ffcv does not import" in results[name]["reason"]
        else:
            assert results[name]["status"] == "ok" and results[name]["items_per_epoch"] == SUBSET


def test_goal_ratios_need_both_sides():
    results = {"tbl/jpeg256": {"throughput": 300.0}, "pil/jpeg-tar": {"throughput": 100.0},
               "tbl/raw256": {"throughput": 50.0}}
    assert variable_images.ratios(results) == {"tbl jpeg256 vs pytorch-pil": 3.0}
    results.update({"ffcv/jpg256": {"throughput": 200.0}, "tbl/jpeg256-fastdct": {"throughput": 320.0}})
    assert variable_images.ratios(results) == {"tbl jpeg256 vs pytorch-pil": 3.0, "tbl jpeg256 vs ffcv jpg256": 1.5,
                                               "tbl jpeg256 fast IDCT (as FFCV decodes) vs ffcv jpg256": 1.6,
                                               "tbl jpeg256 vs ffcv jpg256 (issue 38)": 1.5}


def test_a_tar_within_the_cap_is_served_whole(run, monkeypatch):
    ctx, _ = run
    monkeypatch.setattr(variable_images, "SUBSET_ROWS", 100)
    assert variable_images.subset_tar(ctx) == ctx.image_tar()
