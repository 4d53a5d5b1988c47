"""Hostile sidecars and names under tbl convert --sidecar / --keep-path: each a named error naming the file,
nothing published, and per-image failures under --on-error."""

from __future__ import annotations

import json
import os

import pytest
from convert_images import error_lines, jpeg_set, run_cli, write_tree

from tbl_loader import PyTreeDataset, convert
from tbl_loader.errors import ImageDecodeError, SidecarError


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("side")
    files = {f"c{k % 2}/{k}.jpg": data for k, data in enumerate(jpeg_set(4, seed=3, lo=20, hi=40))}
    return write_tree(root / "src", files), sorted(files)


def sidecar(path, names, field):
    path.write_text(json.dumps({n: {field: k, "score": k / 2} for k, n in enumerate(names)}))
    return path


@pytest.mark.parametrize(("field", "kw"), [
    ("height", {"max_size": 32}), ("width", {"max_size": 32, "store": "jpeg"}), ("label", {"size": 16}),
    ("path", {"size": 16, "keep_path": True}), ("orig_size", {"size": 16}), ("image", {"max_size": 32}),
])
def test_a_field_named_like_a_written_column_is_refused(source, tmp_path, field, kw):
    src, names = source
    side = sidecar(tmp_path / "s.json", names, field)
    size = kw.pop("size", None)
    with pytest.raises(SidecarError, match=f"s.json: field '{field}' is reserved: the converter writes a "
                                           f"'{field}' column itself"):
        convert(src, tmp_path / "out", size, shard_rows=2, workers=1, progress=False, sidecar=side, **kw)
    assert not (tmp_path / "out").exists()


def test_a_height_field_on_the_cli_publishes_nothing(source, tmp_path):
    src, names = source
    side = sidecar(tmp_path / "s.json", names, "height")
    result = run_cli(str(src), str(tmp_path / "out.tbl"), "--max-size", "32", "--workers", "1", "--quiet",
                     "--sidecar", str(side))
    assert result.returncode == 2 and "field 'height' is reserved" in "\n".join(error_lines(result.stderr))
    assert not (tmp_path / "out.tbl").exists()


def test_fields_other_than_the_written_columns_still_convert(source, tmp_path):
    src, names = source
    side = sidecar(tmp_path / "s.json", names, "depth")
    convert(src, tmp_path / "out.tbl", None, max_size=32, workers=1, progress=False, sidecar=side)
    with PyTreeDataset(tmp_path / "out.tbl") as ds:
        assert [ds[i]["depth"] for i in range(len(ds))] == list(range(len(names)))
        assert [ds[i]["height"] for i in range(len(ds))] == [ds[i]["image"].shape[0] for i in range(len(ds))]


def test_a_fifo_sidecar_is_refused_unopened(source, tmp_path):
    src, _ = source
    fifo = tmp_path / "side.json"
    os.mkfifo(fifo)
    result = run_cli(str(src), str(tmp_path / "out.tbl"), "--size", "16", "--workers", "1", "--quiet",
                     "--sidecar", str(fifo), timeout=60)
    lines = "\n".join(error_lines(result.stderr))
    assert result.returncode == 2 and "side.json: the sidecar is a FIFO, not a regular file" in lines
    assert not (tmp_path / "out.tbl").exists()


@pytest.mark.parametrize(("name", "text", "match"), [
    ("s.csv", "path,caption\nc0/0.jpg," + "x" * 200_000 + "\n", r"s\.csv: line 2: field larger than field limit"),
    ("s.json", "[" * 200_000 + "]" * 200_000, r"s\.json: JSON nested too deeply"),
    ("t.json", "", r"t\.json: field 'f': list values that are not arrays of numbers"),
    ("u.json", b"\xff\xfe{}", r"u\.json: cannot read the sidecar"),
])
def test_unreadable_sidecars_are_named(source, tmp_path, name, text, match):
    src, names = source
    path = tmp_path / name
    if name == "t.json":  # every image gets a value nested past numpy's 64 dimensions
        deep = 1
        for _ in range(70):
            deep = [deep]
        text = json.dumps({n: {"f": deep} for n in names})
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SidecarError, match=match):
        convert(src, tmp_path / "out.tbl", 16, workers=1, progress=False, sidecar=path)
    result = run_cli(str(src), str(tmp_path / "cli.tbl"), "--size", "16", "--workers", "1", "--quiet",
                     "--sidecar", str(path))
    assert result.returncode == 2 and name in "\n".join(error_lines(result.stderr))
    assert not (tmp_path / "out.tbl").exists() and not (tmp_path / "cli.tbl").exists()


def test_a_non_utf8_name_with_keep_path_is_an_image_error_under_on_error(tmp_path):
    data = jpeg_set(3, seed=5, lo=20, hi=40)
    src = write_tree(tmp_path / "src", {"c0/a.jpg": data[0], "c1/c.jpg": data[2]})
    bad = os.fsencode(src / "c0") + b"/b\xff.jpg"
    with open(bad, "wb") as f:
        f.write(data[1])
    name = os.fsdecode(b"c0/b\xff.jpg")
    with pytest.raises(ImageDecodeError, match=r"its name is not UTF-8 \(b'c0/b\\xff\.jpg'\)") as info:
        convert(src, tmp_path / "fail.tbl", 16, workers=1, progress=False, keep_path=True)
    assert info.value.name == name and not (tmp_path / "fail.tbl").exists()
    result = run_cli(str(src), str(tmp_path / "skip.tbl"), "--size", "16", "--workers", "1", "--quiet",
                     "--keep-path", "--on-error", "skip")
    assert result.returncode == 1, result.stderr
    report = json.loads((tmp_path / "skip.tbl.report.json").read_text())
    assert [e["name"] for e in report["errors"]] == [name]
    with PyTreeDataset(tmp_path / "skip.tbl") as ds:
        assert [ds[i]["path"] for i in range(len(ds))] == ["c0/a.jpg", "c1/c.jpg"]
    # without keep_path the name is never stored: the image converts
    convert(src, tmp_path / "plain.tbl", 16, workers=1, progress=False)
    with PyTreeDataset(tmp_path / "plain.tbl") as ds:
        assert len(ds) == 3
