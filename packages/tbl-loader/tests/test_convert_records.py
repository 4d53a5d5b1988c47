"""tbl convert from record sources: WebDataset shards, Parquet, a HuggingFace datasets folder, a JSONL manifest.

The same real photos with captions and labels, written in each layout with that layout's own tools
(webdataset's ShardWriter, pyarrow, datasets' save_to_disk), each convert with one command to a dataset
equal row for row to the folder-with-sidecar conversion; then the hostile inputs of each source.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from convert_images import error_lines, jpeg_set, run_cli, write_tree
from record_sources import CLASSES, hf_dataset, samples, write_manifest, write_parquet, write_webdataset

from tbl_loader import PyTreeDataset, convert
from tbl_loader.conversion import convert_table
from tbl_loader.errors import DestinationError, ImageDecodeError, SourceError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

PER_CLASS = 17  # 51 photos


def _samples():
    return samples(PER_CLASS)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Every layout of the same samples, and the folder-with-sidecar conversion they must equal."""
    root = tmp_path_factory.mktemp("records")
    samples = _samples()
    folder = write_tree(root / "folder", {name: data for name, _, _, data in samples})
    sidecar = root / "side.json"
    sidecar.write_text(json.dumps({name: {"caption": cap} for name, _, cap, _ in samples}))
    reference = root / "reference.tbl"
    convert(folder, reference, 32, workers=1, progress=False, sidecar=sidecar, report=False)
    return root, samples, folder, reference


def _rows(path, caption_field):
    ds = PyTreeDataset(path)
    try:
        return [(ds[i]["image"].copy(), int(ds[i]["label"]), ds[i][caption_field]) for i in range(len(ds))]
    finally:
        ds.close()


def _assert_same_rows(path, caption_field, reference):
    got, want = _rows(path, caption_field), _rows(reference, "caption")
    assert len(got) == len(want) == len(CLASSES) * PER_CLASS
    for i, ((gi, gl, gc), (wi, wl, wc)) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(gi, wi), i
        assert (gl, gc) == (wl, wc), i


def test_webdataset_shards_convert_equal_to_the_folder(sources):
    root, samples, _, reference = sources
    shards = write_webdataset(root / "wds", samples)
    assert len(shards) == 3
    dst = root / "from_wds.tbl"
    r = run_cli(str(root / "wds" / "shard-{000000..000002}.tar"), str(dst), "--size", "32", "--workers", "2",
                "--quiet")
    assert r.returncode == 0, r.stderr
    _assert_same_rows(dst, "txt", reference)
    assert not list(root.glob(".tbl-convert-*")), "the scratch file of image bytes is removed"


def test_parquet_with_hf_image_structs_converts_equal_to_the_folder(sources):
    root, samples, _, reference = sources
    src = write_parquet(root / "train.parquet", samples)
    assert pq.ParquetFile(src).num_row_groups == 4
    dst = root / "from_parquet.tbl"
    r = run_cli(str(src), str(dst), "--size", "32", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    _assert_same_rows(dst, "caption", reference)


def test_datasets_folder_converts_equal_to_the_folder_and_keeps_class_names(sources):
    pytest.importorskip("datasets")
    root, samples, _, reference = sources
    ds = hf_dataset(samples)
    ds.save_to_disk(str(root / "hf"))
    dst = root / "from_hf.tbl"
    r = run_cli(str(root / "hf"), str(dst), "--size", "32", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    _assert_same_rows(dst, "caption", reference)
    out = PyTreeDataset(dst)
    assert out.metadata["classes"] == list(CLASSES)
    out.close()
    # The Dataset object itself, through the Python API.
    again = root / "from_hf_object.tbl"
    convert(ds, again, 32, workers=1, progress=False, report=False)
    _assert_same_rows(again, "caption", reference)


def test_jsonl_manifest_converts_equal_to_the_folder(sources):
    root, samples, folder, reference = sources
    manifest = write_manifest(folder, samples)
    dst = root / "from_manifest.tbl"
    r = run_cli(str(manifest), str(dst), "--size", "32", "--workers", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    _assert_same_rows(dst, "caption", reference)
    ds = PyTreeDataset(dst)
    assert ds.metadata["classes"] == list(CLASSES)
    ds.close()


def test_webdataset_fields_by_extension_and_key_overrides(tmp_path):
    wds = pytest.importorskip("webdataset")
    photos = jpeg_set(3, seed=5)
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        for i, data in enumerate(photos):
            sink.write({"__key__": f"k{i}", "png.jpg": data, "json": {"score": i / 2, "tags": ["a", "b"]},
                        "npy": np.arange(4, dtype=np.int16) * i, "kind.txt": ["red", "green", "blue"][i]})
    dst = tmp_path / "out.tbl"
    convert(tmp_path / "a.tar", dst, 16, workers=1, progress=False, report=False, source_format="webdataset",
            image_key="png.jpg", label_key="kind.txt")
    ds = PyTreeDataset(dst)
    assert ds.metadata["classes"] == ["blue", "green", "red"]
    for i in range(3):
        row = ds[i]
        assert int(row["label"]) == [2, 1, 0][i]  # red, green, blue among the sorted names
        assert row["json"]["score"] == i / 2 and list(row["json"]["tags"]) == ["a", "b"]
        assert row["npy"].dtype == np.int16 and np.array_equal(row["npy"], np.arange(4, dtype=np.int16) * i)
    ds.close()


def test_parquet_columns_map_from_the_arrow_schema(tmp_path):
    photos = jpeg_set(4, seed=6)
    table = pa.table({
        "image": pa.array(photos, pa.binary()),
        "label": pa.array([3, 1, 3, 0], pa.int32()),
        "score": pa.array([0.5, 1.0, 2.0, 3.0], pa.float32()),
        "ok": [True, False, True, True],
        "boxes": pa.array([[[1.0, 2.0, 3.0, 4.0]], [], [[0.0, 0.0, 1.0, 1.0], [2, 2, 3, 3]], []],
                          pa.list_(pa.list_(pa.float64(), 4))),
        "meta": [{"w": 1, "src": "a"}, {"w": 2, "src": "b"}, {"w": 3, "src": "c"}, {"w": 4, "src": "d"}],
        "blob": pa.array([b"\x00", b"", b"zz", b"\xff"], pa.binary()),
    })
    pq.write_table(table, tmp_path / "t.parquet")
    dst = tmp_path / "out.tbl"
    convert(tmp_path / "t.parquet", dst, 16, workers=1, progress=False, report=False)
    ds = PyTreeDataset(dst)
    leaves = ds.schema.leaves
    assert leaves["score"].kind == "float" and leaves["ok"].kind == "bool" and leaves["blob"].kind == "bytes"
    assert leaves["boxes"].kind == "var_array" and leaves["boxes"].dtype == "float64"
    assert ds.metadata["classes"] == ["0", "1", "2", "3"]
    for i in range(4):
        row = ds[i]
        assert int(row["label"]) == [3, 1, 3, 0][i]
        assert row["score"] == [0.5, 1.0, 2.0, 3.0][i] and bool(row["ok"]) == [True, False, True, True][i]
        want = np.asarray(table.column("boxes")[i].as_py(), np.float64).reshape(-1, 4)
        assert np.array_equal(row["boxes"], want)
        assert row["meta"] == {"w": i + 1, "src": "abcd"[i]} and row["blob"] == table.column("blob")[i].as_py()
    ds.close()


# ---------------------------------------------------------------- hostile inputs


def _nothing_published(dst):
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".tbl-convert-") or ".tmp" in p.name]


def test_webdataset_key_without_an_image(tmp_path):
    wds = pytest.importorskip("webdataset")
    photos = jpeg_set(3, seed=7)
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": photos[0], "cls": 0})
        sink.write({"__key__": "k1", "txt": "no image here", "cls": 1})
        sink.write({"__key__": "k2", "jpg": photos[2], "cls": 1})
    dst = tmp_path / "out" / "ds.tbl"
    with pytest.raises(SourceError, match=r"k1: in shard .*a\.tar.*no image member"):
        convert([tmp_path / "a.tar"], dst, 16, workers=1, progress=False, source_format="webdataset")
    _nothing_published(dst)
    rep = convert([tmp_path / "a.tar"], dst, 16, workers=1, progress=False, source_format="webdataset",
                  on_error="skip")
    assert rep.written == 2 and [e.name for e in rep.skipped] == ["k1"]
    ds = PyTreeDataset(dst)
    assert [int(ds[i]["label"]) for i in range(len(ds))] == [0, 1]
    ds.close()


def test_webdataset_duplicate_keys_across_shards(tmp_path):
    samples = _samples()[:6]
    shards = write_webdataset(tmp_path / "wds", samples, maxcount=3)
    assert len(shards) == 2
    wds = pytest.importorskip("webdataset")
    with wds.TarWriter(str(tmp_path / "wds" / "shard-000002.tar")) as sink:  # a key of shard 0 again
        sink.write({"__key__": "s00001", "jpg": samples[5][3], "cls": 2, "txt": "again"})
    dst = tmp_path / "ds.tbl"
    r = run_cli(str(tmp_path / "wds" / "shard-{000000..000002}.tar"), str(dst), "--size", "16", "--quiet")
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r.stderr)
    assert "s00001" in line and "shard-000002.tar" in line and "shard-000000.tar" in line
    _nothing_published(dst)
    rep = convert(tmp_path / "wds", dst, 16, workers=1, progress=False, on_error="skip")
    assert [e.name for e in rep.skipped] == ["s00001"] and "shard-000002.tar" in rep.skipped[0].message
    ds = PyTreeDataset(dst)
    assert len(ds) == 6 and ds[1]["txt"] == samples[1][2]
    ds.close()


def test_truncated_webdataset_shard(tmp_path):
    shards = write_webdataset(tmp_path / "wds", _samples()[:8], maxcount=4)
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    dst = tmp_path / "ds.tbl"
    for on_error in ("fail", "skip"):
        with pytest.raises(SourceError, match=r"shard-000001\.tar.* truncated"):
            convert(tmp_path / "wds", dst, 16, workers=1, progress=False, on_error=on_error)
        _nothing_published(dst)


def test_parquet_with_a_corrupt_row_group(tmp_path):
    samples = _samples()[:12]
    src = write_parquet(tmp_path / "t.parquet", samples, row_group_size=4)
    meta = pq.ParquetFile(src).metadata
    column = meta.row_group(1).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(src.read_bytes())
    raw[start : start + 64] = b"\xff" * 64  # the row group's first page header no longer parses
    src.write_bytes(bytes(raw))
    dst = tmp_path / "ds.tbl"
    with pytest.raises(SourceError, match=r"t\.parquet' row group 1 \(rows 4\.\.7\)"):
        convert(src, dst, 16, workers=1, progress=False)
    _nothing_published(dst)
    rep = convert(src, dst, 16, workers=1, progress=False, on_error="skip")
    assert rep.written == 8 and len(rep.skipped) == 1 and "row group 1" in rep.skipped[0].name
    ds = PyTreeDataset(dst)
    kept = samples[:4] + samples[8:]
    assert [ds[i]["caption"] for i in range(len(ds))] == [c for _, _, c, _ in kept]
    ds.close()


def test_manifest_line_pointing_outside_its_folder(tmp_path):
    data = jpeg_set(2, seed=9)
    write_tree(tmp_path / "m", {"a.jpg": data[0]})
    (tmp_path / "outside.jpg").write_bytes(data[1])
    manifest = tmp_path / "m" / "list.csv"
    dst = tmp_path / "ds.tbl"
    for bad in ("../outside.jpg", "cat/../../outside.jpg", str(tmp_path / "outside.jpg")):
        manifest.write_text(f"path,label\na.jpg,0\n{bad},1\n")
        for on_error in ("fail", "skip"):
            with pytest.raises(SourceError, match=rf"line 3: image path {bad!r} points outside the manifest's"):
                convert(manifest, dst, 16, workers=1, progress=False, on_error=on_error)
            _nothing_published(dst)
    r = run_cli(str(manifest), str(dst), "--size", "16", "--quiet", "--on-error", "skip")
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r.stderr)
    assert "line 3" in line and "outside the manifest's folder" in line
    _nothing_published(dst)


def test_manifest_bad_image_follows_on_error(tmp_path):
    data = jpeg_set(2, seed=10)
    write_tree(tmp_path / "m", {"a.jpg": data[0], "b.jpg": data[1][: len(data[1]) // 3]})
    manifest = tmp_path / "m" / "list.jsonl"
    manifest.write_text('{"path": "a.jpg", "label": 0}\n{"path": "b.jpg", "label": 1}\n')
    dst = tmp_path / "ds.tbl"
    with pytest.raises(ImageDecodeError, match="b.jpg"):
        convert(manifest, dst, 16, workers=1, progress=False)
    _nothing_published(dst)
    rep = convert(manifest, dst, 16, workers=1, progress=False, on_error="skip")
    assert rep.written == 1 and [e.name for e in rep.errors] == ["b.jpg"]


def test_record_source_refusals_name_the_option(tmp_path):
    src = write_parquet(tmp_path / "t.parquet", _samples()[:2])
    with pytest.raises(SourceError, match="no label column 'cls'.*--label-key"):
        convert(src, tmp_path / "a.tbl", 16, workers=1, progress=False, label_key="cls")
    with pytest.raises(ValueError, match="label_file applies to a TAR or folder"):
        convert(src, tmp_path / "a.tbl", 16, workers=1, progress=False, label_file=src)
    with pytest.raises(ValueError, match="source format must be one of"):
        convert(src, tmp_path / "a.tbl", 16, workers=1, progress=False, source_format="csv")
    assert sorted(os.listdir(tmp_path)) == ["t.parquet"]


def test_parts_and_variable_size_jpeg_from_a_record_source(sources):
    """--part / --merge and --max-size --store jpeg work on a record source as on the folder."""
    root, samples, folder, _ = sources
    src = write_parquet(root / "parts.parquet", samples)
    one = root / "one_go"
    convert(src, one, max_size=40, store="jpeg", workers=1, progress=False, shard_rows=20, report=False)
    parts = [root / f"part{i}.tbl" for i in range(3)]
    for i, part in enumerate(parts):
        convert(src, part, max_size=40, store="jpeg", workers=1, progress=False, part=f"{i}/3")
    r = run_cli("--merge", *map(str, parts), str(root / "merged"), "--quiet")
    assert r.returncode == 0, r.stderr
    sidecar = root / "side.json"
    reference = root / "reference_jpeg"
    convert(folder, reference, max_size=40, store="jpeg", workers=1, progress=False, shard_rows=20, report=False,
            sidecar=sidecar)
    want = PyTreeDataset(reference)
    for path in (one, root / "merged"):
        got = PyTreeDataset(path)
        assert len(got) == len(want) == len(samples)
        for i in range(len(want)):
            g, w = got[i], want[i]
            assert bytes(g["image"]) == bytes(w["image"]) and (g["height"], g["width"]) == (w["height"], w["width"])
            assert (int(g["label"]), g["caption"]) == (int(w["label"]), w["caption"])
        got.close()
    want.close()


def test_arrow_ipc_file_and_refused_columns(tmp_path):
    photos = jpeg_set(3, seed=11)
    table = pa.table({"image": pa.array(photos, pa.binary()), "label": ["b", "a", "b"], "n": [1, 2, 3]})
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:  # the IPC file format
        writer.write_table(table)
    dst = tmp_path / "out.tbl"
    convert(tmp_path / "t.arrow", dst, 16, workers=1, progress=False, report=False)
    ds = PyTreeDataset(dst)
    assert ds.metadata["classes"] == ["a", "b"]
    assert [(int(ds[i]["label"]), int(ds[i]["n"])) for i in range(3)] == [(1, 1), (0, 2), (1, 3)]
    ds.close()
    with_null = table.set_column(2, "n", pa.array([1, None, 3], pa.int64()))
    pq.write_table(with_null, tmp_path / "null.parquet")
    with pytest.raises(SourceError, match=r"column 'n'.*1 null value"):
        convert(tmp_path / "null.parquet", tmp_path / "null.tbl", 16, workers=1, progress=False)
    dated = table.append_column("when", pa.array([0, 1, 2], pa.timestamp("s")))
    pq.write_table(dated, tmp_path / "dated.parquet")
    with pytest.raises(SourceError, match=r"column 'when'.*timestamp"):
        convert(tmp_path / "dated.parquet", tmp_path / "dated.tbl", 16, workers=1, progress=False)
    assert not (tmp_path / "null.tbl").exists() and not (tmp_path / "dated.tbl").exists()


def test_a_datasets_dict_is_refused_naming_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    photos = jpeg_set(2, seed=12)
    split = datasets.Dataset.from_dict({"image": [{"bytes": p, "path": None} for p in photos], "label": [0, 1]})
    both = datasets.DatasetDict({"train": split, "test": split})
    both.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"DatasetDict.*'train'.*'test'|DatasetDict.*'test'.*'train'"):
        convert(tmp_path / "dd", tmp_path / "a.tbl", 16, workers=1, progress=False)
    with pytest.raises(SourceError, match="give one split"):
        convert(both, tmp_path / "a.tbl", 16, workers=1, progress=False)
    convert(tmp_path / "dd" / "train", tmp_path / "a.tbl", 16, workers=1, progress=False, report=False)
    ds = PyTreeDataset(tmp_path / "a.tbl")
    assert [int(ds[i]["label"]) for i in range(2)] == [0, 1]
    ds.close()


def test_a_generic_table_converts_to_a_pytree_dataset(tmp_path):
    table = pa.table({
        "id": pa.array([7, 8, 9], pa.int16()),
        "text": ["a", "bb", ""],
        "vec": pa.array([[1.5, 2.5], [0.0, -1.0], [3.0, 4.0]], pa.list_(pa.float32(), 2)),
        "meta": [{"ok": True}, {"ok": False}, {"ok": True}],
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    dst = tmp_path / "t.tbl"
    assert convert_table(tmp_path / "t.parquet", dst) == 3
    ds = PyTreeDataset(dst)
    assert ds.schema.leaves["vec"].kind == "array" and ds.schema.leaves["vec"].dtype == "float32"
    for i in range(3):
        row = ds[i]
        assert int(row["id"]) == [7, 8, 9][i] and row["text"] == ["a", "bb", ""][i]
        assert np.array_equal(row["vec"], np.asarray(table.column("vec")[i].as_py(), np.float32))
        assert bool(row["meta"]["ok"]) == [True, False, True][i]
    ds.close()
    with pytest.raises(DestinationError, match="exists"):
        convert_table(tmp_path / "t.parquet", dst)
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"x": [1.0, 2.0], "y": [1, 0]}).cast_column(
        "y", datasets.ClassLabel(names=["no", "yes"]))
    assert convert_table(hf, tmp_path / "hf.tbl") == 2
    ds = PyTreeDataset(tmp_path / "hf.tbl")
    assert ds.metadata["class_names"] == {"y": ["no", "yes"]}
    assert [(float(ds[i]["x"]), int(ds[i]["y"])) for i in range(2)] == [(1.0, 1), (2.0, 0)]
    ds.close()
