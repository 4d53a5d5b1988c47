"""`tbl bench SUITE --data PATH`: parsing, and tiny real runs on generated data (structure only, nothing timed)."""

import json
import subprocess
import sys

import pytest

from tbl_bench.cli import main
from tbl_bench.data import make_image_tar
from tbl_bench.user_data import UserData, UserDataError, data_kind


@pytest.fixture(scope="module")
def tar(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "mine.tar"
    make_image_tar(path, 40, num_classes=4, min_size=64, max_size=96, seed=3)
    return path


@pytest.fixture(scope="module")
def rows_tbl(tmp_path_factory):
    from tbl_format import write

    path = tmp_path_factory.mktemp("user") / "rows.tbl"
    write(({"id": i, "name": f"r{i}", "x": float(i)} for i in range(500)), path)
    return path


def _bench(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tbl_bench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_options_without_data_are_refused(capsys):
    assert main(["images", "--batch-size", "8"]) == 2
    assert "--batch-size go with --data PATH" in capsys.readouterr().err
    assert main(["images", "--dtype", "float16"]) == 2
    assert "--dtype go with --data PATH" in capsys.readouterr().err


def test_bad_data_is_refused(tmp_path, tar, capsys):
    assert main(["images", "--data", str(tmp_path / "nope.tar")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "junk.bin").write_bytes(b"not a dataset")
    assert main(["images", "--data", str(tmp_path / "junk.bin"), "--out", str(tmp_path / "o")]) == 2
    assert "neither a JPEG TAR nor a .tbl dataset" in capsys.readouterr().err
    assert main(["kernels", "--data", str(tar)]) == 2
    assert "--data works with the suites convert, images, pytree_read, not kernels" in capsys.readouterr().err
    assert main(["images", "--data", str(tar), "--batch-size", "0"]) == 2
    assert "batch size must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["images", "--data", str(tar), "--dtype", "float64"])


def test_user_data_settings(tar, rows_tbl):
    assert data_kind(tar) == "image-tar" and data_kind(rows_tbl) == "pytree-tbl"
    with pytest.raises(UserDataError, match="threads must be >= 1"):
        UserData(str(tar), threads=0)
    assert UserData(str(tar), batch_size=16, dtype="bfloat16").to_dict()["dtype"] == "bfloat16"


def test_images_on_a_users_tar_with_their_settings(tmp_path, tar):
    proc = _bench("images", "--data", tar, "--batch-size", 16, "--image-size", 32, "--dtype", "float16",
                  "--threads", 1, "--quick", "--json", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)  # stdout is the summary alone; progress went to stderr
    assert "[images] tbl/consume/plain/32" in proc.stderr
    assert out["quick"] and out["data"]["batch_size"] == 16 and out["data"]["dtype"] == "float16"
    assert out["machine"]["usable_cores"] >= 1 and len(out["machine"]["loadavg_start"]) == 3
    rows = {r["name"]: r for r in out["suites"]["images"]}
    expected = {f"{tool}/{level}/{aug}/32" for tool in ("tbl",) for level in ("produce", "consume")
                for aug in ("plain", "flip", "crop")}
    expected |= {f"pil/consume/{aug}/32" for aug in ("plain", "flip", "crop")}
    expected |= {"memcpy/produce/32", "memcpy/consume/32"}
    assert set(rows) == expected  # no numpy reference: it writes float32 only
    for r in rows.values():
        assert r["status"] == "ok", (r["name"], r["reason"])
        assert r["throughput"] > 0 and r["min_s"] <= r["median_s"] <= r["max_s"]
    for name in expected - {"memcpy/produce/32", "memcpy/consume/32"}:
        assert rows[name]["params"]["batch_size"] == 16
    assert rows["tbl/consume/plain/32"]["params"]["dtype"] == "float16"
    assert rows["tbl/consume/plain/32"]["params"]["threads"] == 1
    assert rows["pil/consume/plain/32"]["params"]["workers"] == 1
    assert rows["memcpy/consume/32"]["params"]["dtype"] == "float16"
    assert rows["tbl/consume/plain/32"]["vs_baseline"] > 0 and rows["tbl/consume/plain/32"]["vs_ceiling"] > 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["suites"]["images"]["results"][0]["items_per_epoch"] == 40
    assert (tmp_path / "out" / "images.png").exists()


def test_images_on_a_users_tbl_and_pytree_read_on_their_rows(tmp_path, tar, rows_tbl):
    from tbl_loader import convert

    tbl = tmp_path / "mine.tbl"
    assert convert(tar, tbl, 24, mode="squash", report=False, progress=False).status == "ok"
    proc = _bench("images", "--data", tbl, "--quick", "--json", "--only", "tbl/consume/plain/*", "--only", "pil/*",
                  "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout)["suites"]["images"]}
    assert rows["tbl/consume/plain/24"]["status"] == "ok"
    assert rows["pil/consume/plain/24"]["status"] == "skipped"
    assert "pass the JPEG TAR as --data" in rows["pil/consume/plain/24"]["reason"]

    proc = _bench("--data", rows_tbl, "--batch-size", 50, "--quick", "--json", "--out", tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["suites"]["pytree_read"]  # the suite that fits a pytree .tbl
    assert [r["name"] for r in rows] == ["tbl/iter", "tbl/item", "tbl/batch-all"]
    assert all(r["status"] == "ok" and r["throughput"] > 0 for r in rows)
    assert rows[2]["params"]["batch_size"] == 50


def test_convert_on_a_users_tar_against_the_decode_limit(tmp_path, tar):
    proc = _bench("convert", "--data", tar, "--image-size", 24, "--quick", "--json", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout)["suites"]["convert"]}
    assert set(rows) == {"decode-limit", "decode-limit-tbl-resize", "tbl"}
    assert rows["decode-limit"]["role"] == rows["decode-limit-tbl-resize"]["role"] == "ceiling"
    assert rows["tbl"]["role"] == "subject"
    for r in rows.values():
        assert r["status"] == "ok", (r["name"], r["reason"])
        assert r["params"]["size"] == 24 and r["params"]["tar"] == str(tar)
    assert rows["tbl"]["params"]["count"] == 40 and rows["tbl"]["vs_ceiling"] > 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["items_per_epoch"] for r in doc["suites"]["convert"]["results"]] == [40, 40, 40]
    assert set(doc["suites"]["convert"]["ratios"]) == {"tbl vs decode-limit", "tbl vs decode-limit-tbl-resize"}


def test_convert_refuses_a_converted_tbl(tmp_path, tar):
    from tbl_loader import convert

    tbl = tmp_path / "mine.tbl"
    assert convert(tar, tbl, 24, mode="squash", report=False, progress=False).status == "ok"
    proc = _bench("convert", "--data", tbl, "--quick", "--out", tmp_path / "out")
    assert proc.returncode == 2 and "the convert suite converts a JPEG TAR" in proc.stderr
