import pytest

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable, Sizes
from tbl_bench.suites import SUITES, load_suite, suite_rounds
from tbl_bench.suites import kernels as kernels_suite


@pytest.mark.parametrize("name", list(SUITES))
def test_every_suite_has_the_suite_attributes(name):
    suite = load_suite(name)
    assert suite.NAME == name
    assert isinstance(suite.TITLE, str) and suite.TITLE
    assert isinstance(suite.UNIT, str) and suite.UNIT.endswith("/s")
    assert isinstance(suite.COMPARE_ON, tuple)
    assert callable(suite.configurations)
    assert suite_rounds(suite, quick=True) == 1 and suite_rounds(suite, quick=False) >= 1


def test_unknown_suite():
    with pytest.raises(KeyError, match="unknown suite"):
        load_suite("nope")


class _Ctx(BenchContext):
    """A context whose inputs are never built: TBL and peer data are unavailable, the rest are names only."""

    def artifact(self, name, key, build):
        return self.data_dir / name

    def peer_artifact(self, name, key, target, kwargs):
        raise DataUnavailable(f"{target}: peer test")

    def peer_call(self, target, kwargs):
        raise RuntimeError(f"{target}: peer test")

    def tbl_images(self, size=None, mode="squash"):
        raise DataUnavailable("tbl_loader.convert is not importable: test")

    def tbl_rows(self, kind):
        raise DataUnavailable("tbl_format.write is not available: test")


def _ctx(tmp_path, **kw):
    return _Ctx(tmp_path, sizes=Sizes(images=10, classes=2, image_size=32, batch_size=4, scalar_rows=10,
                                      array_rows=10, warmup=1, epochs=2), **kw)


@pytest.fixture(autouse=True)
def _no_device_probe(monkeypatch):
    import tbl_bench.suites.resident

    monkeypatch.setattr(tbl_bench.suites.resident, "pick_device", lambda: "cpu")  # no torch import here


@pytest.mark.parametrize("peers", [False, True])
@pytest.mark.parametrize("name", list(SUITES))
def test_configurations_are_unique_configs_and_skip_with_the_reason(tmp_path, name, peers):
    configs = load_suite(name).configurations(_ctx(tmp_path, peers=peers))
    assert configs and all(isinstance(c, Config) and c.suite == name for c in configs)
    assert len({c.name for c in configs}) == len(configs)
    tbl = [c for c in configs if c.tool == "tbl" and c.params.get("path") == ""]
    assert all("test" in c.skip for c in tbl)
    assert all("peer test" in c.skip for c in configs if c.peer and c.skip)
    if not peers:
        assert not any(c.peer for c in configs)
    assert any(c.skip is None for c in configs) or name == "resident"


@pytest.mark.parametrize("name", ["convert", "images", "train", "kernels", "format_read", "pytree_read",
                                  "pytree_dataloader", "tokens"])
def test_suites_with_peers_mark_them(tmp_path, name):
    configs = load_suite(name).configurations(_ctx(tmp_path, peers=True))
    peer_tools = {c.tool for c in configs if c.peer}
    assert peer_tools and peer_tools <= {"turboloader", "litdata", "ffcv", "mosaic", "webdataset"}
    assert not any(c.peer for c in configs if c.tool in ("tbl", "tbl_format", "pil", "list"))


def test_images_suite_compares_like_with_like(tmp_path):
    configs = load_suite("images").configurations(_ctx(tmp_path))
    for c in configs:
        if c.role != "ceiling":
            assert {"level", "aug"} <= set(c.params)
    assert {c.role for c in configs} == {"subject", "baseline", "ceiling"}


def test_kernels_configurations(tmp_path):
    full = {c.name: c for c in kernels_suite.configurations(_ctx(tmp_path, peers=True))}
    quick = {c.name: c for c in kernels_suite.configurations(_ctx(tmp_path, quick=True))}
    assert "tbl-160-bfloat16-2t" in full and "turboloader-crop-256to224-float32" in full
    assert "tbl-160-float32-1t" not in quick and not any(n.startswith("turboloader") for n in quick)
    c = full["tbl-224-float16-2t"]
    assert (c.warmup, c.epochs, c.min_time_s, c.max_epochs) == (3, 20, 1.0, 2000)
    assert c.env == {"OMP_NUM_THREADS": "2"} and not c.rss and c.params["inputs"] == 23
    assert full["copy-224"].role == "ceiling" and full["turboloader-224-float32"].peer
    assert (quick["tbl-224-float32-2t"].warmup, quick["tbl-224-float32-2t"].epochs) == (2, 5)
    assert kernels_suite.ROUNDS == 3


@pytest.mark.parametrize("levels", [["scalar", "baseline", "avx2"], ["scalar", "baseline", "avx2", "avx512"]])
def test_kernels_pin_avx2_beside_the_avx512_level(tmp_path, monkeypatch, levels):
    """Where the kernels have the avx512 level, float32 also runs pinned to avx2 (TBL_KERNELS_SIMD), so that the
    report shows what the lookup in registers gains; elsewhere the two would be one configuration twice."""
    import tbl_kernels

    monkeypatch.setattr(tbl_kernels, "simd_levels", lambda: list(levels))
    configs = {c.name: c for c in kernels_suite.configurations(_ctx(tmp_path))}
    pinned = sorted(n for n in configs if n.endswith("-avx2"))
    if "avx512" not in levels:
        assert pinned == []
        return
    assert pinned == [f"tbl-{s}-float32-{t}t-avx2" for s in (160, 224) for t in (1, 2)]
    c = configs["tbl-224-float32-2t-avx2"]
    assert c.env == {"OMP_NUM_THREADS": "2", "TBL_KERNELS_SIMD": "avx2"}
    assert c.params["simd"] == "avx2" and c.params["dtype"] == "float32" and c.params["op"] == "gather"
    assert "simd" not in configs["tbl-224-float32-2t"].params


def test_kernel_batch_refuses_a_level_it_does_not_run():
    import tbl_kernels

    other = next(level for level in tbl_kernels.simd_levels() if level != tbl_kernels.simd_level())
    with pytest.raises(RuntimeError, match=f"not the pinned '{other}'"):
        kernels_suite.kernel_batch("tbl", "gather", 8, "float32", 1, 1, simd=other)


def _ok(throughput, bytes_per_batch=None):
    return {"throughput": throughput, "median_s": 256 / throughput, "info": {"bytes_per_batch": bytes_per_batch}}


def test_kernels_ratios():
    results = {"copy-224": _ok(1000.0, 100), "tbl-224-float32-2t": _ok(1500.0, 100),
               "tbl-224-float32-1t": _ok(1000.0, 100), "tbl-224-float16-2t": _ok(3000.0, 60),
               "turboloader-224-float16": _ok(1000.0, 60),
               "tbl-crop-256to224-float32-1t": _ok(100.0), "tbl-crop-256to224-float32-2t": _ok(150.0),
               "tbl-224-float32-1t-avx2": _ok(800.0, 100)}
    r = kernels_suite.ratios(results)
    assert r["224: float32 at the chosen level vs avx2 (1t)"] == pytest.approx(1.25)
    assert "224: float32 at the chosen level vs avx2 (2t)" not in r
    assert r["224: float32 2t bytes/s vs copy"] == pytest.approx(1.5)
    assert r["224: float16 vs float32 images/s (2t)"] == pytest.approx(2.0)
    assert r["224: float16 tbl 2t vs turboloader"] == pytest.approx(3.0)
    assert r["224: float32 2t vs 1t"] == pytest.approx(1.5)
    assert r["crop float32 2t vs 1t"] == pytest.approx(1.5)
    assert not any(k.startswith("160") for k in r)
    halves = {"tbl-160-float16-1t": _ok(1000.0), "tbl-160-bfloat16-1t": _ok(970.0),
              "tbl-160-float16-2t": _ok(2000.0), "tbl-160-bfloat16-2t": _ok(2100.0)}
    r = kernels_suite.ratios(halves)  # without the float32 configurations (--only), these ratios still come
    assert r == {"160: bfloat16 vs float16 images/s (1t)": pytest.approx(0.97),
                 "160: bfloat16 vs float16 images/s (2t)": pytest.approx(1.05)}


def test_images_peers_are_every_tool_users_pick_on_the_same_data(tmp_path):
    configs = load_suite("images").configurations(_ctx(tmp_path, peers=True, quick=True))
    peers = {c.tool for c in configs if c.peer}
    assert peers == {"turboloader", "litdata", "ffcv", "mosaic", "webdataset"}
    base = next(c for c in configs if c.name == "pil/consume/plain/32")
    for c in configs:
        if c.peer and c.params.get("level") == "consume" and c.params.get("aug") == "plain":
            # same batch size, image size and consumer as the baseline
            assert (c.params["batch_size"], c.params["size"]) == (base.params["batch_size"], base.params["size"])
    assert {c.params["aug"] for c in configs if c.tool == "ffcv"} == {"plain", "flip", "crop"}
    assert {c.params["level"] for c in configs if c.tool == "ffcv"} == {"produce", "consume"}


def test_tokens_workload_checks_every_window_of_its_warmup_epoch(tmp_path):
    torch = pytest.importorskip("torch")
    from tbl_bench.suites import tokens

    tokens.write_tbl(str(tmp_path / "t"), 300_000)
    threads = torch.get_num_threads()
    try:
        for level in tokens.LEVELS:
            work = tokens.tbl_loader_epochs(str(tmp_path / "t"), 300_000, level)
            assert work.run_epoch(0) == work.items_per_epoch
            assert work.info["checked"]["windows"] == work.items_per_epoch // (tokens.SEQ + 1)
            # the consuming process's torch threads are set by the workload, for every loader alike
            assert work.info["consumer_torch_threads"] == tokens.CONSUMER_TORCH_THREADS == torch.get_num_threads()
            work.close()
    finally:
        torch.set_num_threads(threads)
    broken = tokens.tbl_loader_epochs(str(tmp_path / "t"), 300_000)
    original = tokens.token
    tokens.token = lambda i: original(i + 1)
    try:
        with pytest.raises(AssertionError, match="differs"):
            broken.run_epoch(0)
    finally:
        tokens.token = original
        broken.close()


def test_fields_cost_runs_the_images_suites_pair_on_a_converted_dataset(tmp_path, capsys):
    pytest.importorskip("torch")
    import json

    import numpy as np

    import tbl_format
    from tbl_bench import fields_cost
    from tbl_bench.suites import images

    rng = np.random.default_rng(0)
    src = tbl_format.write(({"image": rng.integers(0, 256, (8, 8, 3), np.uint8), "label": i % 3} for i in range(96)),
                           tmp_path / "src.tbl")
    assert fields_cost.main([str(src), "--data-dir", str(tmp_path / "data"), "--rounds", "1", "--epochs", "1",
                             "--batch-size", "16", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "round 1 tbl/consume/plain/8/images-only" in out and "round 1 tbl/consume/plain/8/fields" in out
    assert "fields / images-only over 1 rounds: median" in out
    doc = json.loads((tmp_path / "out.json").read_text())
    assert len(doc["ratios"]) == 1 and doc["ratios"][0] > 0
    with tbl_format.open(tmp_path / "data" / "src-fields.tbl") as ds:  # the copy the pair reads
        assert set(images.FIELDS) <= set(ds.leaf_paths) and len(ds) == 96


def test_convert_configurations_and_ratios(tmp_path):
    from tbl_bench.suites import convert as convert_suite

    configs = {c.name: c for c in convert_suite.configurations(_ctx(tmp_path, peers=True))}
    layouts = {f"tbl-from-{layout}" for layout in ("webdataset", "parquet", "hf", "manifest")}
    assert set(configs) == {"decode-limit", "decode-limit-tbl-resize", "tbl", "turboloader", "litdata", "ffcv-raw",
                            "ffcv-jpg", "litdata-from-parquet", *layouts}
    assert configs["litdata-from-parquet"].peer and configs["litdata-from-parquet"].params["parquet"] == \
        configs["tbl-from-parquet"].params["tar"]
    assert configs["decode-limit"].role == configs["decode-limit-tbl-resize"].role == "ceiling"
    assert configs["tbl"].role == "subject"
    assert configs["decode-limit-tbl-resize"].params["resize"] == "tbl" and "resize" not in configs["decode-limit"].params
    cores = convert_suite.usable_cores()
    assert all(c.params["workers"] == cores and c.params["size"] == 32 for c in configs.values())
    assert "peer test" in configs["ffcv-raw"].skip and configs["ffcv-jpg"].params["write_mode"] == "jpg"
    results = {"tbl": _ok(900.0), "decode-limit": _ok(1000.0), "decode-limit-tbl-resize": _ok(1200.0),
               "turboloader": _ok(300.0), "ffcv-raw": _ok(450.0)}
    assert convert_suite.ratios(results) == {"tbl vs decode-limit": pytest.approx(0.9),
                                             "tbl vs decode-limit-tbl-resize": pytest.approx(0.75),
                                             "tbl vs turboloader": pytest.approx(3.0),
                                             "tbl vs ffcv-raw": pytest.approx(2.0)}
    assert convert_suite.ratios({"decode-limit": _ok(1.0)}) == {}
    assert convert_suite.ratios({"tbl": _ok(800.0), "tbl-from-parquet": _ok(760.0)}) == {
        "tbl-from-parquet vs tbl": pytest.approx(0.95)}
    assert convert_suite.ratios({"tbl": _ok(800.0), "tbl-from-parquet": _ok(760.0),
                                 "litdata-from-parquet": _ok(380.0)})["tbl-from-parquet vs litdata-from-parquet"] == \
        pytest.approx(2.0)


def test_convert_from_each_layout_stores_the_tars_rows(tmp_path):
    """The tbl-from-* subjects convert the same images and labels as the TAR: equal datasets, row for row."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    import numpy as np

    from tbl_bench.suites import convert as convert_suite
    from tbl_loader import PyTreeDataset

    ctx = BenchContext(tmp_path, sizes=Sizes(images=10, classes=2, image_size=32, batch_size=4, scalar_rows=10,
                                             array_rows=10, warmup=1, epochs=2))  # builds its inputs
    configs = {c.name: c for c in convert_suite.configurations(ctx)}
    rows = {}
    for name in ("tbl", "tbl-from-webdataset", "tbl-from-parquet", "tbl-from-hf", "tbl-from-manifest"):
        config = configs[name]
        assert config.skip is None, config.skip
        params = {**config.params, "workers": 1}
        w = convert_suite.tbl_convert(**params)
        try:
            assert w.run_epoch(0) == 10
            ds = PyTreeDataset(w._last)
            rows[name] = [(ds[i]["image"].copy(), int(ds[i]["label"])) for i in range(len(ds))]
            ds.close()
        finally:
            w.close()
    want = rows.pop("tbl")
    assert len(want) == 10 and len({y for _, y in want}) == 2
    for name, got in rows.items():
        assert len(got) == 10, name
        for (gi, gy), (wi, wy) in zip(got, want, strict=True):
            assert np.array_equal(gi, wi) and gy == wy, name


@pytest.mark.parametrize("suffix", [".out", ""])  # a file, a folder
def test_conversion_epochs_delete_the_previous_output_untimed(suffix):
    """Each epoch converts into a fresh path; the previous output goes in prepare_epoch (the runner does
    not time it), the last one with the folder at close."""
    from tbl_bench.conversions import ConversionEpochs

    class Writes(ConversionEpochs):
        def __init__(self):
            self.items_per_epoch, self.info, self.made = 3, {}, []
            super().__init__("tbl-bench-test-", suffix)

        def convert_into(self, dst):
            self.made.append(dst)
            if suffix:
                dst.write_bytes(b"x" * 10)
            else:
                dst.mkdir()
                for name in ("a", "b"):
                    (dst / name).write_bytes(b"x" * 5)
            return self.items_per_epoch

    w = Writes()
    for epoch in range(3):
        assert [p for p in w.made if p.exists()] == w.made[-1:]  # the previous epoch's output is left ...
        w.prepare_epoch(epoch)
        assert not any(p.exists() for p in w.made)  # ... until the next epoch is prepared
        assert w.run_epoch(epoch) == 3
        assert w.made[-1].exists() and w.info["output_bytes"] == 10
    assert len(set(w.made)) == 3
    folder = w.made[-1].parent
    w.close()
    assert not folder.exists()


def test_convert_steps_splits_a_worker_into_its_steps(tmp_path, capsys):
    import json

    from tbl_bench import convert_steps, data

    tar = tmp_path / "photos.tar"
    data.make_image_tar(tar, 70, num_classes=2, min_size=64, max_size=96, seed=3, workers=1)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert convert_steps.main([str(tar), "--size", "32", "--scratch", str(scratch), "--json",
                               str(tmp_path / "steps.json")]) == 0
    doc = json.loads((tmp_path / "steps.json").read_text())
    assert doc["images"] == 70 and doc["size"] == 32  # two chunks, the second a short one
    assert list(doc["steps"]) == list(convert_steps.VARIANTS)
    assert doc["steps"]["decode-limit"]["cpu_vs_limit"] == 1.0
    assert all(s["user_us"] > 0 and s["wall_us"] > 0 for s in doc["steps"].values())
    assert list(scratch.iterdir()) == []  # the scratch file is removed
    assert "+ direct write" in capsys.readouterr().out


def test_columnar_compressed_configurations_and_ratios(tmp_path):
    from tbl_bench.suites import columnar

    configs = {c.name: c for c in columnar.configurations(_ctx(tmp_path, peers=True))}
    for codec in ("lz4", "zstd"):
        w = configs[f"tbl-{codec}/write"]
        assert w.params["compression"] == codec and w.rss
        scans = [configs[f"tbl-{codec}-{fmt}/scan"] for fmt in ("arrow", "pytree")]
        assert all(c.params["path"].endswith(f"-{codec}.tbl") and c.params["op"] == "scan" for c in scans)
    assert "compression" not in configs["tbl/write"].params
    results = {"tbl/write": {"throughput": 100.0, "info": {"bytes": 400}},
               "tbl-zstd/write": {"throughput": 50.0, "info": {"bytes": 200}},
               "lance/write": {"throughput": 200.0, "info": {"bytes": 250}},
               "tbl-arrow/scan": {"throughput": 10.0}, "tbl-zstd-arrow/scan": {"throughput": 5.0},
               "lance/scan": {"throughput": 20.0}}
    r = columnar.ratios(results)
    assert r["size: tbl zstd / lance bytes"] == 0.8 and r["size: tbl / lance bytes"] == 1.6
    assert r["write: tbl zstd vs tbl rows/s"] == 0.5 and r["write: tbl zstd vs lance rows/s"] == 0.25
    assert r["scan: zstd arrow vs raw arrow"] == 0.5 and r["scan: zstd arrow vs lance"] == 0.25
    assert not any("lz4" in k for k in r)


def test_columnar_peers_read_the_same_rows_and_litdata_writes_fewer(tmp_path, monkeypatch):
    from tbl_bench.suites import columnar

    monkeypatch.setattr(columnar, "LITDATA_WRITE_ROWS", 4)
    configs = {c.name: c for c in columnar.configurations(_ctx(tmp_path, peers=True))}
    for peer, ops in (("lance", ("scan", "take", "item")), ("hf", ("scan", "take", "item")),
                      ("litdata", ("scan", "item"))):
        for op in ops:
            c = configs[f"{peer}/{op}"]
            assert c.peer and c.params == {"path": "", "op": op, "rows": 10} and "peer test" in c.skip
        assert configs[f"{peer}/write"].peer and configs[f"{peer}/write"].rss
    assert "litdata/take" not in configs  # no batch read: its scan is a row at a time
    assert configs["litdata/write"].params["rows"] == 4 and configs["litdata/write"].epochs == 1
    assert configs["hf/write"].params["rows"] == 10 and configs["tbl/item"].params["op"] == "item"
    results = {"tbl/item": {"throughput": 600.0}, "hf/item": {"throughput": 200.0},
               "litdata/item": {"throughput": 2.0}, "tbl-arrow/take": {"throughput": 50.0},
               "hf/take": {"throughput": 100.0}, "tbl/write": {"throughput": 30.0},
               "litdata/write": {"throughput": 3.0}}
    r = columnar.ratios(results)
    assert r["item: tbl vs hf"] == 3.0 and r["item: tbl vs litdata"] == 300.0
    assert r["take: arrow vs hf"] == 0.5 and r["write: tbl vs litdata rows/s"] == 10.0


def test_columnar_item_reads_draw_the_same_rows_for_every_reader():
    from tbl_bench.suites import columnar

    seen = []
    mine = columnar._Reads(lambda rows: seen.append(list(rows)) or len(rows), 100, "item", item_rows=10)
    theirs = columnar._Reads(lambda rows: seen.append(list(rows)) or len(rows), 100, "item", item_rows=3)
    for reads in (mine, theirs):
        reads.prepare_epoch(7)
        assert reads.run_epoch(7) == reads.items_per_epoch
    assert len(seen[0]) == 10 and seen[1] == seen[0][:3] and len(set(seen[0])) == 10
