"""tbl convert end to end: sources, labels, exact pixels, workers, failures, parts, shards, CLI."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("skimage")

from convert_images import jpeg_set, truncated_jpeg, variants, write_tar, write_tree

import tbl_format
from tbl_loader.cli import register_convert
from tbl_loader.conversion.decode import reference_preprocess
from tbl_loader.conversion.images import convert, merge_parts, part_range
from tbl_loader.errors import ImageDecodeError, SourceError

S = 32


def read_back(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    ds = tbl_format.open(path)
    try:
        images = np.concatenate([np.array(a) for a in ds.segments("image")])
        labels = np.concatenate([np.array(a) for a in ds.segments("label")])
        return images, labels, ds.metadata
    finally:
        ds.close()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def imagenet_files() -> dict[str, bytes]:
    """ImageNet layout: 3 classes, 7 images each (sizes 40-120), relative names in unsorted insertion order."""
    data = jpeg_set(21, seed=5)
    classes = ["n0002_zebra", "n0001_cat", "n0003_dog"]
    return {f"{classes[i % 3]}/img_{20 - i:03d}.JPEG": d for i, d in enumerate(data)}


def expected(files: dict[str, bytes], size: int = S, mode: str = "center_crop") -> tuple[np.ndarray, np.ndarray]:
    names = sorted(files)
    classes = sorted({n.split("/")[-2] for n in names})
    images = np.stack([reference_preprocess(files[n], size, mode) for n in names])
    labels = np.array([classes.index(n.split("/")[-2]) for n in names], np.int64)
    return images, labels


def test_folder_tree_labels_pixels_metadata(tmp_path: Path, imagenet_files: dict[str, bytes]) -> None:
    root = write_tree(tmp_path / "src", imagenet_files)
    (root / "n0001_cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    rep = convert(root, tmp_path / "out.tbl", S, workers=1, progress=False)
    images, labels, meta = read_back(tmp_path / "out.tbl")
    want_images, want_labels = expected(imagenet_files)
    assert np.array_equal(images, want_images)
    assert np.array_equal(labels, want_labels) and labels.dtype == np.int64
    assert meta["classes"] == ["n0001_cat", "n0002_zebra", "n0003_dog"]
    pre = meta["preprocess"]
    assert (pre["size"], pre["mode"], pre["resample"], pre["draft"]) == (S, "center_crop", "bilinear", True)
    assert pre["converter"].startswith("tbl-loader ") and pre["pillow"]
    assert rep.status == "ok" and rep.written == 21 and rep.failed == 0 and rep.ignored_files == 2
    report = json.loads((tmp_path / "out.tbl.report.json").read_text())
    assert report["written"] == 21 and report["status"] == "ok" and report["images_per_s"] > 0
    assert leftovers(tmp_path) == []
    convert(root, tmp_path / "b.tbl", S, workers=1, progress=False, report=tmp_path / "custom.json")
    convert(root, tmp_path / "c.tbl", S, workers=1, progress=False, report=False)
    assert (tmp_path / "custom.json").is_file() and not (tmp_path / "b.tbl.report.json").exists()
    assert not (tmp_path / "c.tbl.report.json").exists()


@pytest.mark.parametrize("gz", [False, True])
def test_tar_imagenet_layout(tmp_path: Path, imagenet_files: dict[str, bytes], gz: bool) -> None:
    # a leading top folder and a member order unlike the sorted order must change nothing
    files = {f"train/{k}": v for k, v in imagenet_files.items()}
    tar = write_tar(tmp_path / ("src.tgz" if gz else "src.tar"), files, order=sorted(files, reverse=True))
    convert(tar, tmp_path / "out.tbl", S, mode="squash", workers=1, progress=False)
    images, labels, meta = read_back(tmp_path / "out.tbl")
    want_images, want_labels = expected(imagenet_files, mode="squash")
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    assert meta["classes"] == ["n0001_cat", "n0002_zebra", "n0003_dog"]
    assert leftovers(tmp_path) == []  # the decompressed scratch TAR is gone


def test_flat_tar_with_label_file(tmp_path: Path) -> None:
    data = jpeg_set(6, seed=7)
    files = {f"img{i}.jpg": d for i, d in enumerate(data)}
    tar = write_tar(tmp_path / "flat.tar", files)
    names = ["tabby", "siamese", "tabby", "persian", "siamese", "tabby"]
    lf = tmp_path / "labels.csv"
    lf.write_text("filename,label\n" + "".join(f"img{i}.jpg,{c}\n" for i, c in reversed(list(enumerate(names)))))
    convert(tar, tmp_path / "a.tbl", S, label_file=lf, workers=1, progress=False)
    images, labels, meta = read_back(tmp_path / "a.tbl")
    assert meta["classes"] == ["persian", "siamese", "tabby"]
    assert labels.tolist() == [meta["classes"].index(c) for c in names]
    assert np.array_equal(images, np.stack([reference_preprocess(d, S) for d in data]))
    # integer labels, tab separated, a subset of the images: unlisted ones are ignored
    lf2 = tmp_path / "labels.tsv"
    lf2.write_text("# comment\nimg5.jpg\t7\nimg0.jpg\t2\n")
    rep = convert(tar, tmp_path / "b.tbl", S, label_file=lf2, workers=1, progress=False)
    images, labels, meta = read_back(tmp_path / "b.tbl")
    assert labels.tolist() == [2, 7] and meta["classes"] == [str(i) for i in range(8)]
    assert np.array_equal(images[1], reference_preprocess(data[5], S)) and rep.ignored_files == 4


def test_list_source_and_source_errors(tmp_path: Path, imagenet_files: dict[str, bytes]) -> None:
    root = write_tree(tmp_path / "src", imagenet_files)
    pairs = [(root / n, n.split("/")[0]) for n in sorted(imagenet_files)[:5]][::-1]
    convert(pairs, tmp_path / "l.tbl", S, workers=1, progress=False)
    images, labels, meta = read_back(tmp_path / "l.tbl")
    assert np.array_equal(images[0], reference_preprocess(pairs[0][0], S))  # a list keeps its order
    assert [meta["classes"][i] for i in labels] == [c for _, c in pairs]
    with pytest.raises(SourceError, match="TAR root"):
        convert(write_tar(tmp_path / "flat.tar", {"a.jpg": jpeg_set(1)[0]}), tmp_path / "x.tbl", S, progress=False)
    bad_labels = tmp_path / "l.csv"
    bad_labels.write_text("a.jpg,0\nmissing.jpg,1\n")
    with pytest.raises(SourceError, match="missing.jpg"):
        convert(tmp_path / "flat.tar", tmp_path / "x.tbl", S, label_file=bad_labels, progress=False)
    flat_gz = write_tar(tmp_path / "flat.tgz", {"a.jpg": jpeg_set(1)[0]}, gzip=True)
    with pytest.raises(SourceError, match="TAR root"):
        convert(flat_gz, tmp_path / "x.tbl", S, progress=False)
    assert leftovers(tmp_path) == []  # the decompressed scratch TAR is removed on errors too
    with pytest.raises(SourceError, match="does not exist"):
        convert(tmp_path / "nope", tmp_path / "x.tbl", S, progress=False)
    with pytest.raises(ValueError, match="part"):
        convert(root, tmp_path / "x.tbl", S, part="2/2", progress=False)
    assert not (tmp_path / "x.tbl").exists()


def test_workers_one_and_two_identical(tmp_path: Path, imagenet_files: dict[str, bytes]) -> None:
    files = dict(imagenet_files)
    files.update({f"n0004_mixed/{k}": v for k, v in variants(seed=11).items()})
    tar = write_tar(tmp_path / "src.tar", files)
    convert(tar, tmp_path / "w1.tbl", 48, workers=1, progress=False)
    rep = convert(tar, tmp_path / "w2.tbl", 48, workers=2, progress=False)
    a, b = read_back(tmp_path / "w1.tbl"), read_back(tmp_path / "w2.tbl")
    assert rep.workers == 2
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert np.array_equal(a[0], np.stack([reference_preprocess(files[n], 48) for n in sorted(files)]))


@pytest.fixture()
def corrupt_tree(tmp_path: Path, imagenet_files: dict[str, bytes]) -> Path:
    files = dict(imagenet_files)
    files["n0002_zebra/bad_truncated.jpg"] = truncated_jpeg()
    files["n0001_cat/bad_text.jpg"] = b"this is not a JPEG"
    files["n0003_dog/bad_empty.jpg"] = b""
    return write_tree(tmp_path / "src", files)


@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_fail_publishes_nothing(tmp_path: Path, corrupt_tree: Path, workers: int) -> None:
    dst = tmp_path / "out" / "data.tbl"
    with pytest.raises(ImageDecodeError, match="n0001_cat/bad_text.jpg") as err:
        convert(corrupt_tree, dst, S, workers=workers, progress=False)
    assert err.value.name == "n0001_cat/bad_text.jpg"  # the first bad file in sorted order
    assert not dst.exists() and leftovers(dst.parent) == []
    report = json.loads(Path(f"{dst}.report.json").read_text())
    assert report["status"] == "failed" and "bad_text.jpg" in report["error"]


def test_corrupt_skip_lists_them(tmp_path: Path, corrupt_tree: Path, imagenet_files: dict[str, bytes]) -> None:
    rep = convert(corrupt_tree, tmp_path / "out.tbl", S, on_error="skip", workers=2, progress=False)
    bad = ["n0001_cat/bad_text.jpg", "n0002_zebra/bad_truncated.jpg", "n0003_dog/bad_empty.jpg"]
    assert [e.name for e in rep.errors] == bad and rep.failed == 3 and rep.written == 21
    assert "truncated" in rep.errors[1].message
    report = json.loads((tmp_path / "out.tbl.report.json").read_text())
    assert [e["name"] for e in report["errors"]] == bad and report["failed"] == 3
    images, labels, _ = read_back(tmp_path / "out.tbl")
    want_images, want_labels = expected(imagenet_files)
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    assert "bad_truncated.jpg" in rep.summary()


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_file_equals_the_streaming_writers(tmp_path: Path, imagenet_files: dict[str, bytes], workers: int) -> None:
    # Images are written in place by their decoders; bad ones (the last one included) leave no hole, and the
    # file is byte for byte the one tbl_format.Writer writes from the same rows, schema and metadata.
    files = dict(imagenet_files)
    files["n0001_cat/bad_text.jpg"] = b"this is not a JPEG"
    files["n0003_dog/zzz_bad_last.jpg"] = truncated_jpeg()
    tar = write_tar(tmp_path / "src.tar", files)
    rep = convert(tar, tmp_path / "out.tbl", S, on_error="skip", workers=workers, progress=False)
    assert rep.failed == 2 and rep.written == 21
    images, labels, meta = read_back(tmp_path / "out.tbl")
    want_images, want_labels = expected(imagenet_files)
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)
    ds = tbl_format.open(tmp_path / "out.tbl")
    schema = ds.schema
    ds.close()
    with tbl_format.Writer(tmp_path / "streamed.tbl", schema, metadata=meta) as w:
        for image, label in zip(images, labels.tolist(), strict=True):
            w.write({"image": image, "label": label})
    assert (tmp_path / "out.tbl").read_bytes() == (tmp_path / "streamed.tbl").read_bytes()
    assert leftovers(tmp_path) == []


def test_rows_around_the_page_cache_make_the_file_the_page_cache_makes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # At 96 px a row is 27,648 bytes, so chunks hold whole blocks that worker processes write with O_DIRECT
    # where the file system takes it; bad images among them leave zero slots the rows after move down over.
    # The same conversion in this process with every write through the page cache gives the same file.
    data = jpeg_set(60, seed=11, lo=100, hi=160)
    files = {f"c{i % 2}/img_{i:03d}.jpg": d for i, d in enumerate(data)}
    files["c0/img_007_bad.jpg"] = b"not a JPEG"
    files["c1/img_030_bad.jpg"] = truncated_jpeg()
    tar = write_tar(tmp_path / "src.tar", files)
    around = convert(tar, tmp_path / "around.tbl", 96, on_error="skip", workers=2, progress=False, report=False)
    chunk_writer = importlib.import_module("tbl_loader.conversion.chunk_writer")
    cached_only = chunk_writer.ChunkWriter.__init__

    def page_cache_only(self, path, base, row_bytes, max_rows, direct=True):
        cached_only(self, path, base, row_bytes, max_rows, direct=False)

    monkeypatch.setattr(chunk_writer.ChunkWriter, "__init__", page_cache_only)
    cached = convert(tar, tmp_path / "cached.tbl", 96, on_error="skip", workers=1, progress=False, report=False)
    assert around.failed == cached.failed == 2 and around.written == cached.written == 60
    assert (tmp_path / "around.tbl").read_bytes() == (tmp_path / "cached.tbl").read_bytes()
    images, _, _ = read_back(tmp_path / "around.tbl")
    good = sorted(n for n in files if "_bad" not in n)
    assert np.array_equal(images, np.stack([reference_preprocess(files[n], 96) for n in good]))


def test_interrupt_leaves_nothing(tmp_path: Path, imagenet_files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    # the package exports the function `convert`, which hides the submodule attribute of the same name
    conv = importlib.import_module("tbl_loader.conversion.images")
    calls = {"n": 0}
    real = conv.Decoder.read

    def interrupted(self, locator):
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return real(self, locator)

    monkeypatch.setattr(conv.Decoder, "read", interrupted)  # every image is read first, on every path
    root = write_tree(tmp_path / "src", imagenet_files)
    for kwargs in ({}, {"shard_rows": 3}):
        calls["n"] = 0
        with pytest.raises(KeyboardInterrupt):
            convert(root, tmp_path / "out", S, workers=1, progress=False, **kwargs)
        assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_parts_merge_equal_unsplit(tmp_path: Path, imagenet_files: dict[str, bytes]) -> None:
    root = write_tree(tmp_path / "src", imagenet_files)
    convert(root, tmp_path / "whole.tbl", S, workers=1, progress=False)
    reps = [convert(root, tmp_path / f"p{i}.tbl", S, part=f"{i}/2", workers=1, progress=False) for i in range(2)]
    assert [r.part_range for r in reps] == [(0, 10), (10, 21)]
    with pytest.raises(ValueError, match="position 0"):
        merge_parts([tmp_path / "p1.tbl", tmp_path / "p0.tbl"], tmp_path / "wrong")
    merge_parts([tmp_path / "p0.tbl", tmp_path / "p1.tbl"], tmp_path / "merged")
    whole, merged = read_back(tmp_path / "whole.tbl"), read_back(tmp_path / "merged")
    assert np.array_equal(whole[0], merged[0]) and np.array_equal(whole[1], merged[1]) and whole[2] == merged[2]
    # a part holding only one class still labels with the whole source's class list
    reps = [convert(root, tmp_path / f"q{i}", S, part=(i, 3), shard_rows=4, workers=1, progress=False) for i in range(3)]
    assert read_back(tmp_path / "q2")[2]["classes"] == whole[2]["classes"]
    merge_parts([tmp_path / f"q{i}" for i in range(3)], tmp_path / "merged3")
    merged3 = read_back(tmp_path / "merged3")
    assert np.array_equal(whole[0], merged3[0]) and np.array_equal(whole[1], merged3[1])


@pytest.mark.parametrize("kwargs", [{"shard_rows": 5}, {"shards": 3}])
def test_sharded_output_reads_back(tmp_path: Path, imagenet_files: dict[str, bytes], kwargs: dict) -> None:
    root = write_tree(tmp_path / "src", imagenet_files)
    convert(root, tmp_path / "sharded", S, workers=1, progress=False, **kwargs)
    ds = tbl_format.open(tmp_path / "sharded")
    rows = ds.segment_rows
    ds.close()
    assert rows == ([5, 5, 5, 5, 1] if "shard_rows" in kwargs else [7, 7, 7])
    images, labels, _ = read_back(tmp_path / "sharded")
    want_images, want_labels = expected(imagenet_files)
    assert np.array_equal(images, want_images) and np.array_equal(labels, want_labels)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tbl")
    register_convert(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli(tmp_path: Path, corrupt_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "c.tbl"
    # a bad image with --on-error fail: the conversion failed, nothing published (3)
    assert cli(["convert", str(corrupt_tree), str(dst), "--size", "24", "--workers", "1", "--quiet"]) == 3
    assert "bad_text.jpg" in capsys.readouterr().err and not dst.exists()
    report = tmp_path / "r.json"
    argv = ["convert", str(corrupt_tree), str(dst), "--size", "24", "--mode", "squash", "--workers", "1",
            "--on-error", "skip", "--report", str(report), "--quiet", "--resample", "lanczos"]
    assert cli(argv) == 1  # published, with images left out
    err = capsys.readouterr().err
    assert "bad_empty.jpg" in err and "3 image(s) failed" in err
    assert json.loads(report.read_text())["failed"] == 3
    meta = read_back(dst)[2]["preprocess"]
    assert (meta["size"], meta["mode"], meta["resample"]) == (24, "squash", "lanczos")
    for i in range(2):
        argv = ["convert", str(corrupt_tree), str(tmp_path / f"p{i}"), "--size", "24", "--part", f"{i}/2",
                "--shards", "2", "--on-error", "skip", "--workers", "1", "--quiet"]
        assert cli(argv) == 1
    assert cli(["convert", "--merge", str(tmp_path / "p0"), str(tmp_path / "p1"), str(tmp_path / "m"), "--quiet"]) == 0
    assert len(read_back(tmp_path / "m")[1]) == 21
    assert cli(["convert", str(corrupt_tree), str(dst)]) == 2  # --size missing


def test_tar_member_bytes_are_exact(tmp_path: Path) -> None:
    """Offsets found by the scan address exactly each member's bytes (pax long names included)."""
    from tbl_loader.conversion.sources import TarReader, open_source

    data = jpeg_set(3, seed=9)
    long_dir = "c" * 120
    files = {f"{long_dir}/{'x' * 150}_{i}.jpg": d for i, d in enumerate(data)}
    tar = tmp_path / "long.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, d in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(d)
            tf.addfile(info, io.BytesIO(d))
    with open_source(tar) as listing:
        reader = TarReader(listing.tar_path)
        got = [reader.read(*loc) for loc in listing.locators]
        reader.close()
        assert listing.classes == [long_dir] and listing.names == sorted(files)
    assert got == [files[n] for n in sorted(files)]


def test_part_ranges_tile_the_source() -> None:
    for n in range(0, 40):
        for k in range(1, 8):
            ranges = [part_range(n, (i, k)) for i in range(k)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_more_parts_than_images(tmp_path: Path) -> None:
    files = {f"c{i}/x.jpg": d for i, d in enumerate(jpeg_set(2, seed=4))}
    root = write_tree(tmp_path / "src", files)
    parts = [tmp_path / f"p{i}.tbl" for i in range(3)]
    reps = [convert(root, p, S, part=(i, 3), workers=2, progress=False) for i, p in enumerate(parts)]
    assert [r.total for r in reps] == [0, 1, 1]
    merge_parts(parts, tmp_path / "m")
    images, labels, meta = read_back(tmp_path / "m")
    assert labels.tolist() == [0, 1] and meta["classes"] == ["c0", "c1"]
    assert np.array_equal(images, np.stack([reference_preprocess(files[n], S) for n in sorted(files)]))
