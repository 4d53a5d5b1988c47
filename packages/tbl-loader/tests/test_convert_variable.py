"""tbl convert --max-size: variable-size raw and JPEG storage, exact pixels and bytes, height/width columns, CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("skimage")

from convert_images import encode, jpeg_set, photos, run_cli, truncated_jpeg, variants, write_tar, write_tree
from PIL import Image

import tbl_format
from tbl_loader.conversion.images import convert
from tbl_loader.conversion.variable import capped_size, reference_variable
from tbl_loader.errors import ImageDecodeError

N = 64  # the cap on the longer side


def rows(path: Path) -> list[dict]:
    with tbl_format.open(path) as ds:
        return [ds[i] for i in range(len(ds))]


def test_capped_size_rule() -> None:
    assert capped_size(64, 40, 64) == (64, 40)  # within the cap: unchanged
    assert capped_size(40, 64, 64) == (40, 64)
    assert capped_size(128, 80, 64) == (64, 40)
    assert capped_size(80, 128, 64) == (40, 64)
    assert capped_size(3, 1000, 64) == (1, 64)  # never below one pixel
    assert capped_size(101, 100, 64) == (64, 63)  # 100 * 64 / 101 = 63.37 -> 63
    assert capped_size(128, 3, 64) == (64, 2)  # 3 * 64 / 128 = 1.5 -> rounds half up to 2
    for w in range(1, 300, 7):
        for h in range(1, 300, 11):
            cw, ch = capped_size(w, h, N)
            assert max(cw, ch) == min(max(w, h), N) and min(cw, ch) >= 1


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_every_colour_case_matches_the_reference(tmp_path: Path, store: str) -> None:
    files = {f"c{i % 2}/{name}": data for i, (name, data) in enumerate(sorted(variants(seed=3).items()))}
    src = write_tree(tmp_path / "src", files)
    rep = convert(src, tmp_path / "out.tbl", max_size=N, store=store, workers=1, progress=False)
    assert rep.status == "ok" and rep.written == len(files) and rep.max_size == N and rep.store == store
    got = rows(tmp_path / "out.tbl")
    for name, row in zip(sorted(files), got, strict=True):
        want = reference_variable(files[name], N, store)
        if store == "raw":
            assert isinstance(row["image"], np.ndarray) and np.array_equal(row["image"], want), name
            h, w = row["image"].shape[:2]
        else:
            assert row["image"] == want, name
            with Image.open(io.BytesIO(row["image"])) as img:
                assert img.format == "JPEG" and img.mode == "RGB"
                w, h = img.size
        assert (row["height"], row["width"]) == (h, w), name
        assert max(h, w) <= N
    with tbl_format.open(tmp_path / "out.tbl") as ds:
        # the sizes are fixed-size columns: zero-copy (rows,) views, no pixel touched
        heights = np.concatenate([np.asarray(s) for s in ds.segments("height")])
        assert heights.dtype == np.int64 and heights.shape == (len(files),)
        kind = ds.schema.leaves["image"].kind
        assert kind == ("var_array" if store == "raw" else "encoded_image")
        pre = ds.metadata["preprocess"]
        assert pre["max_size"] == N and pre["store"] == store and "size" not in pre
        assert ("decoder" in pre) == (store == "jpeg")
        if store == "jpeg":
            assert pre["quality"] == 90 and pre["decoder"]["name"] == "simplejpeg"


def test_rotated_image_is_stored_upright(tmp_path: Path) -> None:
    data = variants(seed=3)["rotated.jpg"]
    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size  # as stored in the file; orientation 6 turns it a quarter
    raw = reference_variable(data, 10_000, "raw")
    assert raw.shape[:2] == (w, h)
    small = reference_variable(data, 32, "raw")
    assert small.shape[:2] == capped_size(h, w, 32)[::-1]


def test_jpeg_within_the_cap_is_kept_byte_for_byte(tmp_path: Path) -> None:
    small = jpeg_set(6, seed=2, lo=20, hi=N)  # every side <= N: kept as they are
    big = jpeg_set(4, seed=3, lo=N + 20, hi=3 * N)  # over the cap: re-encoded at the quality asked for
    files = {f"a/s{i}.jpg": d for i, d in enumerate(small)} | {f"b/b{i}.jpg": d for i, d in enumerate(big)}
    src = write_tar(tmp_path / "src.tar", files)
    convert(src, tmp_path / "q.tbl", max_size=N, store="jpeg", quality=70, workers=2, progress=False)
    got = {name: row for name, row in zip(sorted(files), rows(tmp_path / "q.tbl"), strict=True)}
    for name, data in files.items():
        stored = got[name]["image"]
        if name.startswith("a/"):
            assert stored == data
        else:
            assert stored != data and stored == reference_variable(data, N, "jpeg", quality=70)
            with Image.open(io.BytesIO(stored)) as img:
                assert max(img.size) == N


def test_workers_and_shards_give_the_same_rows(tmp_path: Path) -> None:
    files = {f"k{i % 3}/{i:03d}.jpg": d for i, d in enumerate(jpeg_set(20, seed=4, lo=30, hi=150))}
    src = write_tar(tmp_path / "src.tar", files)
    convert(src, tmp_path / "one.tbl", max_size=N, workers=1, progress=False)
    convert(src, tmp_path / "many", max_size=N, workers=2, shard_rows=6, progress=False)
    a, b = rows(tmp_path / "one.tbl"), rows(tmp_path / "many")
    assert len(a) == len(b) == 20
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x["image"], y["image"]) and (x["height"], x["width"], x["label"]) == (
            y["height"], y["width"], y["label"])


def test_bad_image_fails_or_is_skipped(tmp_path: Path) -> None:
    files = {"a/good.jpg": jpeg_set(1, seed=1)[0], "a/bad.jpg": truncated_jpeg()}
    src = write_tree(tmp_path / "src", files)
    with pytest.raises(ImageDecodeError, match="bad.jpg"):
        convert(src, tmp_path / "x.tbl", max_size=N, store="jpeg", workers=1, progress=False)
    assert not (tmp_path / "x.tbl").exists()
    rep = convert(src, tmp_path / "y.tbl", max_size=N, store="jpeg", workers=1, progress=False, on_error="skip")
    assert rep.written == 1 and [e.name for e in rep.errors] == ["a/bad.jpg"]


def test_size_and_max_size_are_exclusive(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a/x.jpg": jpeg_set(1)[0]})
    with pytest.raises(ValueError, match="exactly one of size"):
        convert(src, tmp_path / "x.tbl", 32, max_size=N, progress=False)
    with pytest.raises(ValueError, match="exactly one of size"):
        convert(src, tmp_path / "x.tbl", progress=False)
    with pytest.raises(ValueError, match="store"):
        convert(src, tmp_path / "x.tbl", max_size=N, store="png", progress=False)
    with pytest.raises(ValueError, match="quality"):
        convert(src, tmp_path / "x.tbl", max_size=N, store="jpeg", quality=0, progress=False)


def test_cli_inspect_and_verify(tmp_path: Path) -> None:
    big = Image.fromarray(photos()[0]).resize((150, 100))
    src = write_tree(tmp_path / "src", {"a/x.jpg": encode(big, "JPEG", quality=90), "b/y.png": encode(big, "PNG")})
    out = tmp_path / "v.tbl"
    r = run_cli(str(src), str(out), "--max-size", str(N), "--store", "jpeg", "--quality", "80", "--quiet")
    assert r.returncode == 0, r.stderr
    meta = tbl_format.open(out).metadata["preprocess"]
    assert (meta["max_size"], meta["store"], meta["quality"]) == (N, "jpeg", 80)
    for bad in (["--size", "32", "--max-size", "64"], [], ["--size", "32", "--store", "raw"],
                ["--max-size", "64", "--quality", "80"], ["--max-size", "64", "--mode", "squash"],
                ["--max-size", "64", "--engine", "ray", "--workers", "2"]):
        r = run_cli(str(src), str(tmp_path / "no.tbl"), *bad, "--quiet")
        assert r.returncode == 2 and not (tmp_path / "no.tbl").exists(), (bad, r.stderr)
    r = run_cli(str(src), str(tmp_path / "r.tbl"), "--max-size", str(N), "--quiet")
    assert r.returncode == 0, r.stderr
    import subprocess
    import sys

    inspect = subprocess.run([sys.executable, "-m", "tbl_format.cli", "inspect", str(tmp_path / "r.tbl")],
                             capture_output=True, text=True, check=True).stdout
    assert "height" in inspect and "width" in inspect and "var_array" in inspect
    assert json.loads(inspect.split("metadata:", 1)[1])["preprocess"]["store"] == "raw"
    ok = subprocess.run([sys.executable, "-m", "tbl_format.cli", "verify", str(tmp_path / "r.tbl")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # a flipped pixel in the heap is caught by the block checksums
    raw = bytearray((tmp_path / "r.tbl").read_bytes())
    header = json.loads(raw[32 : 32 + int.from_bytes(raw[12:16], "little")])
    (image_column,) = [c for c in header["columns"] if c["path"] == "image"]
    raw[image_column["regions"]["heap"]["offset"] + 100] ^= 0xFF
    (tmp_path / "bad.tbl").write_bytes(bytes(raw))
    bad = subprocess.run([sys.executable, "-m", "tbl_format.cli", "verify", str(tmp_path / "bad.tbl")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "bad.tbl" in bad.stdout + bad.stderr


def _pillow_tolerates_decoder_refuses() -> bytes:
    """A JPEG with damaged entropy data that Pillow loads (libjpeg only warns) and strict decoding refuses."""
    import simplejpeg

    data = jpeg_set(1, seed=3, lo=100, hi=120)[0]
    for pos in range(len(data) // 2, len(data) - 10, 37):
        bad = bytearray(data)
        bad[pos] ^= 0x55
        try:
            with Image.open(io.BytesIO(bytes(bad))) as img:
                img.load()
        except Exception:
            continue
        try:
            simplejpeg.decode_jpeg(bytes(bad), "RGB", strict=True)
        except ValueError:
            return bytes(bad)
    pytest.fail("no damaged JPEG that Pillow loads and the decoder refuses")


def test_jpeg_the_serve_decoder_refuses_is_a_bad_image(tmp_path: Path) -> None:
    pytest.importorskip("simplejpeg")
    files = {"a/good.jpg": jpeg_set(1, seed=1, lo=20, hi=N)[0], "a/damaged.jpg": _pillow_tolerates_decoder_refuses()}
    src = write_tree(tmp_path / "src", files)
    with pytest.raises(ImageDecodeError, match="damaged.jpg"):
        convert(src, tmp_path / "x.tbl", max_size=1000, store="jpeg", workers=1, progress=False)
    rep = convert(src, tmp_path / "y.tbl", max_size=1000, store="jpeg", workers=1, progress=False, on_error="skip")
    assert rep.written == 1 and [e.name for e in rep.errors] == ["a/damaged.jpg"]


def test_jpeg_store_without_the_decoder_names_the_pip_command(tmp_path: Path, monkeypatch) -> None:
    import sys

    from tbl_loader.errors import JpegDecoderUnavailableError

    src = write_tree(tmp_path / "src", {"a/x.jpg": jpeg_set(1)[0]})
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with pytest.raises(JpegDecoderUnavailableError, match=r"tbl-loader\[jpeg\]"):
        convert(src, tmp_path / "x.tbl", max_size=N, store="jpeg", progress=False)
    assert not (tmp_path / "x.tbl").exists()
    rep = convert(src, tmp_path / "r.tbl", max_size=N, store="raw", workers=1, progress=False)  # raw needs no decoder
    assert rep.written == 1


def test_keep_path_and_sidecar_columns_beside_variable_images(tmp_path: Path) -> None:
    """--keep-path and --sidecar add their columns to a --max-size conversion as to a fixed-size one."""
    files = {f"k{i % 2}/{i:03d}.jpg": d for i, d in enumerate(jpeg_set(6, seed=5, lo=30, hi=150))}
    src = write_tree(tmp_path / "src", files)
    sidecar = tmp_path / "side.json"
    sidecar.write_text(json.dumps({name: {"caption": f"photo {name}"} for name in files}))
    convert(src, tmp_path / "v.tbl", max_size=N, store="raw", keep_path=True, sidecar=sidecar, progress=False)
    plain = rows(tmp_path / "v.tbl")
    convert(src, tmp_path / "p.tbl", max_size=N, store="raw", progress=False)
    for row, base in zip(plain, rows(tmp_path / "p.tbl"), strict=True):
        assert np.array_equal(row["image"], base["image"]) and row["height"] == base["height"]
        assert row["caption"] == f"photo {row['path']}"
        width, height = Image.open(src / row["path"]).size
        assert list(row["orig_size"]) == [height, width]
