"""tbl_loader.ray on a real local Ray cluster started here (two CPUs): datasink, datasource, conversion.

Skipped as a whole when Ray is not installed (the ray extra); CI installs it. Every Ray job costs
seconds on a small machine, so each test runs as few jobs as it can.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'tbl-loader[ray]'")

from convert_images import jpeg, jpeg_set, truncated_jpeg, write_tar, write_tree  # noqa: E402
from record_sources import hf_dataset, samples, write_manifest, write_parquet, write_webdataset  # noqa: E402

import tbl_format  # noqa: E402
import tbl_loader  # noqa: E402
from tbl_format.cli import main as tbl_main  # noqa: E402
from tbl_loader.ray import OrderError, TblDatasink, TblDatasource, read_tbl  # noqa: E402
from tbl_loader.ray import convert as ray_convert  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    """One local Ray cluster for every test here, shut down at the end; Ray Data keeps the dataset's order."""
    # The workers import the map functions defined here by module name: they inherit this PYTHONPATH.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), old) if p)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def pytree_row(row):
    """Row i of the test pytree: scalars, a fixed array, a variable array, a string, bytes, a nested dict."""
    i = int(row["id"])
    return {
        "id": i,
        "x": np.arange(4, dtype=np.float32) + i,
        "v": np.full(i % 3, i, dtype=np.int16),
        "name": f"row-{i}",
        "raw": bytes([i % 256]) * (i % 5),
        "meta": {"even": i % 2 == 0, "half": i / 2},
    }


def expected_rows(n):
    return [pytree_row({"id": i}) for i in range(n)]


def assert_rows_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            if isinstance(w[k], np.ndarray):
                assert isinstance(g[k], np.ndarray) and g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]), k
            else:
                assert g[k] == w[k] and type(g[k]) is type(w[k]), (k, g[k], w[k])


def leftovers(parent: Path):
    return sorted(p.name for p in parent.iterdir() if ".tbl-tmp-" in p.name)


class Crash:
    """A map stage whose worker process dies once, at row ``at``, guarded by a marker file (``os._exit``)."""

    def __init__(self, marker: str, at: int) -> None:
        self.marker, self.at = marker, at

    def __call__(self, row):
        if int(row["id"]) == self.at:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass  # the retry: go on
            else:
                os.close(fd)
                os._exit(1)  # the worker process dies mid-job, as a killed or OOM-killed one does
        return pytree_row(row)


def test_datasink_writes_a_pytree_and_read_tbl_reads_it_back_exactly(cluster, tmp_path):
    n = 3000
    dst = tmp_path / "out"
    sink = TblDatasink(dst, shard_rows=500)
    ray.data.range(n, override_num_blocks=6).map(pytree_row).write_datasink(sink)
    assert sink.result == {"path": str(dst), "rows": n, "parts": 6}
    with tbl_format.open(dst) as ds:
        ds.verify()
        assert max(ds.segment_rows) <= 500 and sum(ds.segment_rows) == n
        assert_rows_equal(list(ds), expected_rows(n))
    assert leftovers(tmp_path) == [] and not any(p.name.startswith(".") for p in dst.iterdir())
    back = read_tbl(dst, override_num_blocks=8).take_all()
    # Ray returns nested dicts as they were; arrays as arrays; the order is the dataset's.
    assert_rows_equal(back, expected_rows(n))


def test_datasink_publishes_a_complete_dataset_after_a_worker_dies_midway(cluster, tmp_path):
    n = 20_000
    dst, marker = tmp_path / "out", tmp_path / "crashed-once"
    sink = TblDatasink(dst, shard_rows=4096)
    ds = ray.data.range(n, override_num_blocks=8).map(Crash(str(marker), at=13_000), max_retries=3)
    ds.write_datasink(sink)
    assert marker.exists()  # the worker did die once
    with tbl_format.open(dst) as out:
        out.verify()
        assert_rows_equal(list(out), expected_rows(n))
    assert leftovers(tmp_path) == []
    assert tbl_main(["verify", str(dst)]) == 0


def test_a_failed_job_publishes_nothing_and_leaves_nothing(cluster, tmp_path):
    def fail_late(row):
        if int(row["id"]) == 1500:
            raise ValueError("bad row 1500")
        return pytree_row(row)

    dst = tmp_path / "out"
    with pytest.raises(Exception, match="bad row 1500"):
        ray.data.range(2000, override_num_blocks=4).map(fail_late).write_datasink(TblDatasink(dst, shard_rows=100))
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_existing_dataset_is_never_replaced(tmp_path):
    dst = tbl_format.write([{"a": 1}], tmp_path / "ds", shard_rows=1)
    before = sorted(p.name for p in dst.iterdir())
    with pytest.raises(tbl_format.DestinationExistsError):
        TblDatasink(dst)
    with pytest.raises(ValueError, match="shard_rows"):
        TblDatasink(tmp_path / "new", shard_rows=0)
    assert sorted(p.name for p in dst.iterdir()) == before


def test_read_tasks_are_one_per_shard_or_per_row_range_of_a_big_shard(tmp_path):
    path = tbl_format.write(({"a": i} for i in range(100)), tmp_path / "one.tbl")
    source = TblDatasource(path)
    assert source.ranges(1) == [(0, 0, 100)]
    assert source.ranges(4) == [(0, 0, 25), (0, 25, 50), (0, 50, 75), (0, 75, 100)]
    shards = tbl_format.write(({"a": i} for i in range(100)), tmp_path / "dir", shard_rows=40)
    assert TblDatasource(shards).ranges(2) == [(0, 0, 40), (1, 0, 40), (2, 0, 20)]  # rows within each shard


@pytest.fixture(scope="module")
def photo_tar(tmp_path_factory):
    """A TAR of 3 classes of JPEGs of varied sizes, and one truncated JPEG in the middle of the order."""
    files = {f"c{k}/img{i:03d}.jpg": jpeg(100 * k + i, side=40 + 7 * i) for k in range(3) for i in range(14)}
    files["c1/img005.jpg"] = truncated_jpeg()
    return write_tar(tmp_path_factory.mktemp("src") / "photos.tar", files)


@pytest.fixture(scope="module")
def photo_tgz(tmp_path_factory):
    """The same kind of TAR, gzip-compressed: decompressed by the listing actor next to the destination."""
    files = {f"c{k}/img{i:03d}.jpg": jpeg(300 + 10 * k + i, side=40 + 5 * i) for k in range(2) for i in range(10)}
    files["c1/img005.jpg"] = truncated_jpeg()
    return write_tar(tmp_path_factory.mktemp("src") / "photos.tar.gz", files, gzip=True)


def assert_same_dataset(a_path, b_path):
    with tbl_format.open(a_path) as a, tbl_format.open(b_path) as b:
        assert a.schema == b.schema and a.metadata == b.metadata and len(a) == len(b)
        a_images, b_images = np.concatenate(a.segments("image")), np.concatenate(b.segments("image"))
        assert np.array_equal(a_images, b_images)
        assert np.array_equal(np.concatenate(a.segments("label")), np.concatenate(b.segments("label")))


def test_convert_on_ray_equals_the_local_converter_row_for_row(cluster, tmp_path, photo_tar):
    local = tbl_loader.convert(photo_tar, tmp_path / "local.tbl", 24, workers=1, on_error="skip", progress=False)
    rep = ray_convert(photo_tar, tmp_path / "ray", 24, on_error="skip", shard_rows=10, images_per_task=16)
    assert_same_dataset(tmp_path / "local.tbl", tmp_path / "ray")
    assert (rep.status, rep.written, rep.failed) == ("ok", local.written, 1)
    assert [e.name for e in rep.errors] == [e.name for e in local.errors] == ["c1/img005.jpg"]
    assert leftovers(tmp_path) == []


def test_convert_on_ray_to_max_size_jpeg_equals_the_local_converter_row_for_row(cluster, tmp_path, photo_tar):
    """`tbl convert --engine ray --max-size 48 --store jpeg` (the ImageNet path): the local converter's rows
    (stored bytes, height, width, label), schema and metadata; sources within the cap kept as they are, the
    others re-encoded; the bad image skipped and reported as locally."""
    import json

    pytest.importorskip("simplejpeg", reason='JPEG storage needs the decoder: pip install "tbl-loader[jpeg]"')
    local = tbl_loader.convert(photo_tar, tmp_path / "local.tbl", max_size=48, store="jpeg", on_error="skip",
                               workers=1, progress=False)
    argv = ["convert", str(photo_tar), str(tmp_path / "ray"), "--max-size", "48", "--store", "jpeg", "--engine", "ray",
            "--shard-rows", "10", "--on-error", "skip", "--quiet"]
    assert tbl_main(argv) == 1  # incomplete: one image skipped, as the local run
    rep = json.loads((tmp_path / "ray.report.json").read_text())
    assert (rep["status"], rep["written"], rep["failed"], rep["max_size"], rep["store"]) == (
        "ok", local.written, 1, 48, "jpeg")
    with tbl_format.open(tmp_path / "local.tbl") as a, tbl_format.open(tmp_path / "ray") as b:
        assert a.schema == b.schema and a.metadata == b.metadata and len(a) == len(b) == local.written
        assert b.schema.leaves["image"].kind == "encoded_image"
        for i in range(len(a)):
            x, y = a[i], b[i]
            assert bytes(x["image"]) == bytes(y["image"])
            assert (x["height"], x["width"], x["label"]) == (y["height"], y["width"], y["label"])
            assert max(y["height"], y["width"]) <= 48
    assert leftovers(tmp_path) == []


def test_convert_on_ray_fails_on_the_first_bad_image_in_source_order(cluster, tmp_path, photo_tgz):
    with pytest.raises(tbl_loader.errors.ImageDecodeError) as err:
        ray_convert(photo_tgz, tmp_path / "ray", 24, images_per_task=4)
    assert err.value.name == "c1/img005.jpg"
    # Nothing published, no staging folder, no decompressed copy of the TAR: only the report of the failure.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ray.report.json"]
    with pytest.raises(tbl_loader.errors.SourceError, match="does not exist"):
        ray_convert(tmp_path / "missing.tar", tmp_path / "ray2", 24)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ray.report.json"]


def test_tbl_convert_engine_ray_from_the_command_line(cluster, tmp_path):
    src = write_tree(tmp_path / "src", {f"{c}/{i}.jpg": jpeg(i + 50 * len(c), side=33 + i) for c in ("cat", "dog")
                                        for i in range(9)})
    assert tbl_main(["convert", str(src), str(tmp_path / "local.tbl"), "--size", "16", "--quiet"]) == 0
    assert tbl_main(["convert", str(src), str(tmp_path / "ray"), "--size", "16", "--quiet", "--engine", "ray",
                     "--shards", "3"]) == 0
    assert_same_dataset(tmp_path / "local.tbl", tmp_path / "ray")
    # Options that do not apply to Ray are refused before anything is written.
    assert tbl_main(["convert", str(src), str(tmp_path / "r2"), "--size", "16", "--engine", "ray", "--part", "0/2"]) == 2
    assert not (tmp_path / "r2").exists()


def assert_same_rows(a_path, b_path):
    """Every leaf of every row equal (arrays by np.array_equal), and the same schema and metadata."""
    with tbl_format.open(a_path) as a, tbl_format.open(b_path) as b:
        assert a.schema == b.schema and a.metadata == b.metadata and len(a) == len(b) > 0
        for i in range(len(a)):
            x, y = a[i], b[i]
            assert x.keys() == y.keys(), i
            for k in x:
                if isinstance(x[k], np.ndarray):
                    assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (i, k)
                else:
                    assert x[k] == y[k], (i, k, x[k], y[k])


@pytest.fixture(scope="module")
def record_sources(tmp_path_factory):
    """The same photos, captions and labels as WebDataset shards, Parquet, a `datasets` folder and a manifest."""
    root = tmp_path_factory.mktemp("records")
    rows = samples(per_class=8)
    write_webdataset(root / "wds", rows, maxcount=9)
    hf_dataset(rows).save_to_disk(str(root / "hf"))
    return {
        "webdataset": str(root / "wds" / "shard-{000000..000002}.tar"),
        "parquet": str(write_parquet(root / "train.parquet", rows, row_group_size=7)),
        "hf": str(root / "hf"),
        "manifest": str(write_manifest(root / "files", rows)),
    }


@pytest.mark.parametrize("kind", ["webdataset", "parquet", "hf", "manifest"])
def test_convert_on_ray_from_a_record_source_equals_the_local_converter(cluster, tmp_path, record_sources, kind):
    """Every record source through the Ray engine: the local converter's rows (image, label, every field), schema
    and metadata (class names included); the scratch file of image bytes is gone after."""
    src = record_sources[kind]
    local = tbl_loader.convert(src, tmp_path / "local.tbl", 24, workers=1, progress=False, report=False)
    rep = ray_convert(src, tmp_path / "ray", 24, shard_rows=7, images_per_task=5, report=False)
    assert (rep.status, rep.written, rep.failed) == ("ok", local.written, 0) and local.written == 24
    assert_same_rows(tmp_path / "local.tbl", tmp_path / "ray")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.fixture(scope="module")
def boxes_tar(tmp_path_factory):
    """A TAR of photos of several sizes, a sidecar of boxes (xyxy, source pixels) and captions, one bad image."""
    root = tmp_path_factory.mktemp("boxes")
    data = jpeg_set(12, seed=9, lo=40, hi=120)
    files = {f"c{i % 2}/img{i:02d}.jpg": d for i, d in enumerate(data)}
    files["c1/img05.jpg"] = truncated_jpeg()
    rng = np.random.default_rng(4)
    side = {name: {"boxes": rng.uniform(0, 40, (int(rng.integers(0, 3)), 4)).round(2).tolist(),
                   "caption": f"photo {name}"} for name in files}
    for entry in side.values():
        for b in entry["boxes"]:
            b[2], b[3] = b[0] + 30, b[1] + 25
    (root / "side.json").write_text(__import__("json").dumps(side))
    return write_tar(root / "photos.tar", files), root / "side.json"


@pytest.mark.parametrize("recipe", [{"size": 24}, {"max_size": 48}])
def test_convert_on_ray_keeps_paths_and_sidecar_fields_and_maps_boxes_as_locally(cluster, tmp_path, boxes_tar,
                                                                                  recipe):
    tar_path, side = boxes_tar
    opts = {"keep_path": True, "sidecar": side, "geometry": {"boxes": "xyxy"}, "on_error": "skip", "report": False,
            **recipe}
    local = tbl_loader.convert(tar_path, tmp_path / "local.tbl", workers=1, progress=False, **opts)
    rep = ray_convert(tar_path, tmp_path / "ray", shard_rows=4, images_per_task=3, **opts)
    assert (rep.written, [e.name for e in rep.errors]) == (local.written, ["c1/img05.jpg"])
    assert_same_rows(tmp_path / "local.tbl", tmp_path / "ray")
    with tbl_format.open(tmp_path / "ray") as ds:
        assert {"path", "orig_size", "boxes", "caption"} <= set(ds.schema.tree)
        assert ds.schema.tree["boxes"].dtype == "float32"


def test_convert_on_ray_a_non_utf8_name_with_keep_path_is_a_bad_image_as_locally(cluster, tmp_path):
    data = jpeg_set(3, seed=5, lo=20, hi=40)
    src = write_tree(tmp_path / "src", {"c0/a.jpg": data[0], "c1/c.jpg": data[2]})
    with open(os.fsencode(src / "c0") + b"/b\xff.jpg", "wb") as f:
        f.write(data[1])
    name = os.fsdecode(b"c0/b\xff.jpg")
    with pytest.raises(tbl_loader.errors.ImageDecodeError, match="its name is not UTF-8") as info:
        ray_convert(src, tmp_path / "fail", 16, keep_path=True, report=False)
    assert info.value.name == name and not (tmp_path / "fail").exists()
    rep = ray_convert(src, tmp_path / "skip", 16, keep_path=True, on_error="skip", report=False)
    assert [e.name for e in rep.errors] == [name]
    with tbl_format.open(tmp_path / "skip") as ds:
        assert [ds[i]["path"] for i in range(len(ds))] == ["c0/a.jpg", "c1/c.jpg"]
    rep = ray_convert(src, tmp_path / "plain", 16, report=False)  # the name is never stored: it converts
    assert rep.written == 3


def test_order_error_is_exported():
    assert issubclass(OrderError, RuntimeError) and "OrderError" in tbl_loader.ray.__all__
