"""Hostile inputs and faults: FIFOs, devices and links in place of files, shards missing or listed twice,
destinations that are not ours, absurd metadata, a dataset changing under a reader, a full disk, a killed
parent. Every case ends in a named error or a defined outcome; nothing hangs (each blocking risk runs under a
timeout) and the CLI never prints a traceback."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tbl_format as tf
from tbl_format import fsutil

CLI_TIMEOUT = 60


def rows(a, b):
    return [{"i": i, "s": f"s{i}"} for i in range(a, b)]


def tbl(*args):
    """Run the tbl CLI in a subprocess under a timeout; (exit code, stderr). Never a traceback."""
    r = subprocess.run([sys.executable, "-m", "tbl_format.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=CLI_TIMEOUT)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stderr


def within(seconds, fn):
    """fn() in a thread; its result or exception, or a failure if it has not returned within ``seconds``."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def set_manifest(d: Path, body: dict) -> None:
    (d / "manifest.json").write_text(json.dumps(body))


# ---- 1. never open what is not a regular file -----------------------------------------------------------------
def test_fifo_in_place_of_a_file_is_refused_unopened(tmp_path):
    f = fifo(tmp_path / "x.tbl")
    with pytest.raises(tf.NotRegularFileError, match=r"x\.tbl.*FIFO"):
        within(10, lambda: tf.open(f))
    assert within(10, lambda: fsutil.file_kind(os.stat(f).st_mode)) == "a FIFO"
    for command in ("inspect", "verify"):
        rc, err = tbl(command, f)
        assert rc == 1 and err.count("\n") == 1 and "NotRegularFileError" in err and str(f) in err


def test_device_in_place_of_a_file_is_refused(tmp_path):
    with pytest.raises(tf.NotRegularFileError, match="character device"):
        tf.open("/dev/null")
    rc, err = tbl("verify", "/dev/null")
    assert rc == 1 and "NotRegularFileError" in err


def test_fifo_or_directory_as_manifest(tmp_path):
    d = tf.write(rows(0, 4), tmp_path / "ds", shard_rows=2)
    (d / "manifest.json").unlink()
    fifo(d / "manifest.json")
    with pytest.raises(tf.NotRegularFileError, match="manifest"):
        within(10, lambda: tf.open(d))
    rc, err = tbl("inspect", d)
    assert rc == 1 and "NotRegularFileError" in err
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()
    with pytest.raises(tf.NotRegularFileError, match="directory"):
        tf.open(d)


def test_missing_file_is_exit_2(tmp_path):
    rc, err = tbl("verify", tmp_path / "nope.tbl")
    assert rc == 2 and "cannot read" in err and err.count("\n") == 1


# ---- 2. lazily opened shards raise named errors -----------------------------------------------------------------
def _broken_shard(d: Path, how: str) -> None:
    first = d / manifest(d)["shards"][0]["file"]
    first.unlink()
    if how == "fifo":
        fifo(first)
    elif how == "directory":
        first.mkdir()
    elif how == "loop":
        first.symlink_to(first.name)
    elif how == "dangling":
        first.symlink_to("nowhere.tbl")


@pytest.mark.parametrize(("how", "error"), [
    ("missing", tf.MissingShardError), ("dangling", tf.MissingShardError), ("loop", tf.MissingShardError),
    ("fifo", tf.NotRegularFileError), ("directory", tf.NotRegularFileError),
])
def test_lazily_opened_shard_errors_are_named(tmp_path, how, error):
    d = tf.write(rows(0, 6), tmp_path / "ds", shard_rows=2)
    _broken_shard(d, how)
    ds = tf.open(d)  # shards open lazily: the manifest alone is read here
    with pytest.raises(error, match="shard-"):
        within(10, lambda: ds[0])
    assert ds[3]["i"] == 3  # the other shards still read
    rc, err = tbl("verify", d)
    assert rc == 1 and error.__name__ in err and err.count("\n") == 1


@pytest.mark.parametrize("name", [".", "a/.", "./x.tbl", "a//b.tbl", "x/../y.tbl"])
def test_manifest_names_that_are_not_plain_paths(tmp_path, name):
    d = tf.write(rows(0, 4), tmp_path / "ds", shard_rows=2)
    body = manifest(d)
    body["shards"][0]["file"] = name
    set_manifest(d, body)
    with pytest.raises(tf.ManifestError, match="not a file path inside"):
        tf.open(d)
    rc, err = tbl("inspect", d)
    assert rc == 1 and "ManifestError" in err


# ---- 3. writer destinations ----------------------------------------------------------------------------------------
def test_existing_file_needs_overwrite(tmp_path):
    dst = tf.write(rows(0, 2), tmp_path / "x.tbl")
    with pytest.raises(tf.DestinationExistsError, match="overwrite=True"):
        tf.write(rows(5, 6), dst)
    with pytest.raises(FileExistsError):  # the standard error a caller may already catch
        tf.Writer(dst)
    assert [r["i"] for r in tf.open(dst)] == [0, 1]
    tf.write(rows(5, 6), dst, overwrite=True)
    assert [r["i"] for r in tf.open(dst)] == [5]


def test_destination_created_meanwhile_is_not_replaced(tmp_path):
    dst = tmp_path / "x.tbl"
    w = tf.Writer(dst)
    w.write(rows(0, 1)[0])
    dst.write_bytes(b"someone else's")
    with pytest.raises(tf.DestinationExistsError):
        w.close()
    assert dst.read_bytes() == b"someone else's" and sorted(p.name for p in tmp_path.iterdir()) == ["x.tbl"]


def _special_files(tmp_path: Path) -> dict[str, Path]:
    out = {"fifo": fifo(tmp_path / "fifo.tbl")}
    target = tf.write(rows(0, 1), tmp_path / "target.tbl")
    out["symlink"] = tmp_path / "link.tbl"
    out["symlink"].symlink_to(target)
    try:
        os.mknod(tmp_path / "null.tbl", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null of our own
        out["device"] = tmp_path / "null.tbl"
    except (PermissionError, OSError):
        pass
    return out


@pytest.mark.parametrize("sharded", [False, True])
def test_special_destinations_are_never_replaced(tmp_path, sharded):
    kw = {"shard_rows": 2} if sharded else {}
    for kind, path in _special_files(tmp_path).items():
        before = os.lstat(path)
        with pytest.raises(tf.DestinationError, match="regular file or a directory"):
            tf.write(rows(0, 3), path, overwrite=True, **kw)
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), kind
    assert not [p for p in tmp_path.iterdir() if ".tbl-tmp-" in p.name]


def test_destination_becoming_a_fifo_before_publish_is_not_replaced(tmp_path):
    dst = tmp_path / "x.tbl"
    w = tf.Writer(dst, overwrite=True)
    w.write(rows(0, 1)[0])
    fifo(dst)
    with pytest.raises(tf.DestinationError):
        w.close()
    assert stat.S_ISFIFO(os.lstat(dst).st_mode)


def test_file_and_directory_destinations_do_not_swap(tmp_path):
    f = tf.write(rows(0, 2), tmp_path / "x.tbl")
    with pytest.raises(tf.DestinationExistsError, match="not a dataset directory"):
        tf.write(rows(0, 2), f, shard_rows=1, overwrite=True)
    d = tf.write(rows(0, 2), tmp_path / "d", shard_rows=1)
    with pytest.raises(IsADirectoryError):
        tf.write(rows(0, 2), d, overwrite=True)


def test_check_destination_api(tmp_path):
    assert tf.check_destination(tmp_path / "new.tbl") == tmp_path / "new.tbl"
    assert tf.check_destination(tmp_path / "a" / "b", directory=True) == tmp_path / "a" / "b"
    with pytest.raises(FileNotFoundError):
        tf.check_destination(tmp_path / "a" / "b.tbl")
    d = tf.write(rows(0, 2), tmp_path / "d", shard_rows=1)
    with pytest.raises(tf.DestinationExistsError, match="holds a dataset"):
        tf.check_destination(d, directory=True)
    assert tf.check_destination(d, directory=True, overwrite=True) == d
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    assert tf.check_destination(tmp_path / "plain", directory=True) == tmp_path / "plain"


def test_overwriting_a_dataset_deletes_only_its_own_shards(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = tf.write(rows(0, 2), outside / "victim.tbl")
    (outside / "sub").mkdir()
    victim_in_dir = tf.write(rows(0, 2), outside / "sub" / "v.tbl")
    d = tf.write(rows(0, 6), tmp_path / "ds", shard_rows=2)
    own = [s["file"] for s in manifest(d)["shards"]]
    (d / "real").mkdir()
    tf.write(rows(0, 1), d / "real" / "inner.tbl")
    (d / "link.tbl").symlink_to(victim)
    (d / "linked-dir").symlink_to(outside / "sub")
    (d / "notes.tbl").write_text("not a TBL file, listed by a hostile manifest")
    (d / "unlisted.txt").write_text("never listed")
    body = manifest(d)
    for name in ("real/inner.tbl", "link.tbl", "linked-dir/v.tbl", "notes.tbl"):
        body["shards"].append({"file": name, "rows": 0, "header_crc32": 0, "size": 0})
    set_manifest(d, body)
    snapshot = {p: p.read_bytes() for p in (victim, victim_in_dir)}

    with pytest.raises(tf.DestinationExistsError):
        tf.write(rows(10, 13), d, shard_rows=2)
    assert all((d / name).exists() for name in own)

    w = tf.Writer(d, shard_rows=2, overwrite=True)
    for r in rows(10, 13):
        w.write(r)
    w.close()
    assert [r["i"] for r in tf.open(d)] == [10, 11, 12]
    assert not any((d / name).exists() for name in own)
    assert not (d / "real" / "inner.tbl").exists()  # a TBL file the directory itself holds: removed
    assert sorted(p.name for p in w.kept) == ["link.tbl", "notes.tbl", "v.tbl"]
    assert {p: p.read_bytes() for p in snapshot} == snapshot  # nothing outside touched
    assert (d / "link.tbl").is_symlink() and (d / "linked-dir").is_symlink()
    assert (d / "notes.tbl").exists() and (d / "unlisted.txt").read_text() == "never listed"


# ---- 4. a shard listed twice ------------------------------------------------------------------------------------------
def test_manifest_listing_a_shard_twice(tmp_path):
    d = tf.write(rows(0, 6), tmp_path / "ds", shard_rows=2)
    body = manifest(d)
    body["shards"].append(body["shards"][0])
    body["rows"] += body["shards"][0]["rows"]
    set_manifest(d, body)
    with pytest.raises(tf.DuplicateShardError, match="same file"):
        tf.open(d)
    rc, err = tbl("verify", d)
    assert rc == 1 and "DuplicateShardError" in err
    # The same shard under another name (a hard link or a copy): the same header checksum.
    body["shards"][-1] = {**body["shards"][0], "file": "copy.tbl"}
    shutil.copy(d / body["shards"][0]["file"], d / "copy.tbl")
    set_manifest(d, body)
    with pytest.raises(tf.DuplicateShardError, match="same header CRC-32"):
        tf.open(d)


def test_merge_of_the_same_part_twice(tmp_path):
    p = tf.write(rows(0, 4), tmp_path / "p", shard_rows=2)
    with pytest.raises(tf.DuplicateShardError):
        tf.merge_manifests([p, p], tmp_path / "m")
    assert not (tmp_path / "m").exists()
    shutil.copytree(p, tmp_path / "copy")
    with pytest.raises(tf.DuplicateShardError, match="same header CRC-32"):
        tf.merge_manifests([p, tmp_path / "copy"], tmp_path / "m")
    single = tf.write(rows(0, 4), tmp_path / "s.tbl")
    with pytest.raises(tf.DuplicateShardError):
        tf.merge_manifests([single, single], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_shards_of_equal_rows_are_not_duplicates(tmp_path):
    same = [{"x": 0}] * 6
    d = tf.write(same, tmp_path / "ds", shard_rows=2)
    assert len({s["header_crc32"] for s in manifest(d)["shards"]}) == 3
    assert list(tf.open(d)) == same
    out = tf.write_parallel(_constant_part, 3, tmp_path / "par", workers=0)
    assert list(tf.open(out)) == [{"x": 0}] * 6
    single = tf.write(same, tmp_path / "one.tbl")  # a single file stays byte-for-byte as before: no file_id
    assert "file_id" not in tf.open(single).shard(0).header


def _constant_part(i):
    return [{"x": 0}] * 2


# ---- 5. metadata ----------------------------------------------------------------------------------------------------
def _nested(depth):
    node: dict = {}
    top = node
    for _ in range(depth - 1):
        node["k"] = {}
        node = node["k"]
    return top


def test_metadata_errors_come_at_construction(tmp_path):
    dst = tmp_path / "x.tbl"
    tf.Writer(dst, metadata=_nested(tf.METADATA_DEPTH)).abort()
    for metadata, match in [
        (_nested(100_000), "deeper than"),
        ({"big": "x" * (17 << 20)}, "header cap"),
        ({1: "a", "1": "b"}, "key 1 is int"),
        ({"a": {(1, 2): "tuple key"}}, r"metadata\['a'\]: key \(1, 2\)"),
        ({"nan": float("nan")}, "NaN"),
        ({"obj": object()}, "JSON-serializable"),
    ]:
        with pytest.raises(tf.MetadataError, match=match):
            tf.Writer(dst, metadata=metadata)
        with pytest.raises(ValueError):  # MetadataError is a ValueError, as the writer raised before
            tf.write(iter(rows(0, 1)), dst, metadata=metadata)
    assert list(tmp_path.iterdir()) == []


def test_schema_and_metadata_over_the_header_cap_fail_before_rows(tmp_path):
    schema = tf.Schema({f"k{i}": tf.Leaf("int") for i in range(100)})
    with pytest.raises(tf.MetadataError, match="over the"):
        tf.Writer(tmp_path / "x.tbl", schema, metadata={"m": "y" * (tf.reader.HEADER_CAP - 10_000)})
    w = tf.Writer(tmp_path / "y.tbl", metadata={"m": "y" * (tf.reader.HEADER_CAP - 10_000)})
    with pytest.raises(tf.MetadataError):
        w.write({f"k{i}": i for i in range(100)})  # the inferred schema is checked at the first row
    w.abort()
    assert list(tmp_path.iterdir()) == []


# ---- 6. the dataset changes under a reader with more shards than max_open ------------------------------------------
@pytest.mark.parametrize("change", ["rewrite", "delete"])
def test_dataset_changed_mid_epoch(tmp_path, change):
    d = tf.write(rows(0, 12), tmp_path / "ds", shard_rows=2)
    ds = tf.open(d, max_open=2)
    it = iter(ds)
    assert [next(it)["i"] for _ in range(5)] == [0, 1, 2, 3, 4]  # shards 0..2 opened, 0 evicted
    if change == "rewrite":
        tf.write(rows(100, 112), d, shard_rows=2, overwrite=True)  # new shards, manifest renamed over
    else:
        shutil.rmtree(d)
    assert next(it)["i"] == 5  # the open map of shard 2 keeps serving the old contents
    with pytest.raises(tf.DatasetChangedError, match=str(d)):
        next(it)  # shard 3 was never opened: the manifest it came from is gone
    with pytest.raises(tf.DatasetChangedError, match="open it again"):
        ds[0]  # shard 0 was evicted: opening it again cannot find the same file
    if change == "rewrite":
        assert [r["i"] for r in tf.open(d)] == list(range(100, 112))


def test_single_file_renamed_over_keeps_serving(tmp_path):
    path = tf.write(rows(0, 3), tmp_path / "x.tbl")
    ds = tf.open(path)
    tf.write(rows(7, 9), path, overwrite=True)
    assert [r["i"] for r in ds] == [0, 1, 2]


def test_unchanged_dataset_reopens_evicted_shards(tmp_path):
    d = tf.write(rows(0, 12), tmp_path / "ds", shard_rows=2)
    ds = tf.open(d, max_open=2)
    assert [ds[i]["i"] for i in (0, 11, 5, 0, 7)] == [0, 11, 5, 0, 7]


# ---- 7. lazy data checks ------------------------------------------------------------------------------------------------
def _big_rows(n, payload=20_000):
    return [{"i": i, "b": bytes([i % 251]) * payload} for i in range(n)]


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


def test_verify_rows_finds_a_flipped_byte_and_names_file_block_rows(tmp_path, hdr, numpy_mode):
    path = tf.write(_big_rows(200), tmp_path / "x.tbl")  # a 4 MB heap: four 1 MiB blocks
    heap = hdr.region(path, "b", "heap")
    _flip(path, heap["offset"] + 2 * (1 << 20) + 5)  # block 2 of the heap
    ds = tf.open(path)
    ds.verify_rows(list(range(0, 100)))  # rows of blocks 0 and 1 only (20,000 bytes each)
    with pytest.raises(tf.DataChecksumError) as info:
        ds.verify_rows([160, 3, 105, 106])  # 105 and 106 lie in block 2, 160 in block 3
    exc = info.value
    assert exc.path == str(path) and exc.block == heap["first_block"] + 2
    assert set(exc.rows) == {105, 106} and "105" in str(exc) and "heap block 2" in str(exc)
    with pytest.raises(tf.DataChecksumError):  # a failed block stays unchecked
        ds.verify_rows([105])
    ds.verify_rows([105], leaves=["i"])  # other leaves' blocks are intact
    with pytest.raises(KeyError):
        ds.verify_rows([0], leaves=["nope"])
    with pytest.raises(IndexError):
        ds.verify_rows([200])


def test_verify_rows_in_a_directory_names_global_rows(tmp_path):
    d = tf.write(_big_rows(200), tmp_path / "ds", shard_rows=100)
    second = d / manifest(d)["shards"][1]["file"]
    from conftest import HeaderTools

    heap = HeaderTools.region(second, "b", "heap")
    _flip(second, heap["offset"] + 10)
    ds = tf.open(d, max_open=1)
    ds.verify_rows(list(range(100)))
    with pytest.raises(tf.DataChecksumError) as info:
        ds.verify_rows([100, 1])
    assert info.value.rows == (100,) and str(second) in str(info.value)


def test_verify_rows_checks_each_block_once(tmp_path, monkeypatch):
    from tbl_format.reader import TblFile

    d = tf.write(_big_rows(120), tmp_path / "ds", shard_rows=40)
    ds = tf.open(d, max_open=1)  # shards are evicted and opened again: the flags live in the dataset
    checked = []
    real = TblFile._check_block

    def counting(self, r, j, *args):
        checked.append((self.path.name, r.first_block + j))
        return real(self, r, j, *args)

    monkeypatch.setattr(TblFile, "_check_block", counting)
    ds.verify_rows(list(range(120)))
    assert len(checked) == len(set(checked)) > 0
    first = len(checked)
    ds.verify_rows(list(range(120)))
    ds.verify_rows([5, 50, 119], leaves=["b"])
    assert len(checked) == first
    assert ds._verified_leaves == {"i", "b"}


def test_verify_rows_agrees_with_verify_on_every_kind(tmp_path, hdr):
    np = pytest.importorskip("numpy")
    pytest.importorskip("lz4")
    samples = [{"a": np.full((3, 5), i, np.float32), "v": np.arange(i % 7, dtype=np.int16), "l": list(range(i % 4)),
                "t": ["x" * (i % 3)] * (i % 3), "o": None if i % 3 else i, "s": "é" * (i % 5), "n": None}
               for i in range(300)]
    for compression in (None, "lz4"):
        path = tf.write(samples, tmp_path / f"k-{compression}.tbl", compression=compression, overwrite=True)
        header = hdr.read(path)
        clean = path.read_bytes()
        for col in header["columns"]:
            for name, region in col["regions"].items():
                if region["size"] == 0 or "crc32" in region:
                    continue  # tables are checked at open
                _flip(path, region["offset"] + region["size"] // 2)
                ds = tf.open(path)
                with pytest.raises(tf.DataChecksumError):
                    ds.verify()
                with pytest.raises(tf.DataChecksumError, match=f"{name} block"):
                    ds.verify_rows(list(range(300)))
                ds.close()
                path.write_bytes(clean)
        ds = tf.open(path)
        ds.verify_rows(list(range(300)))
        assert ds._verified_leaves == set(ds.leaf_paths)


def test_verify_rows_on_a_turboloader_file():
    golden = Path(__file__).parent / "golden"
    ds = tf.open(golden / "v2_valid_raw.tbl")
    ds.verify_rows(list(range(len(ds))))
    assert ds._verified_leaves == set(ds.leaf_paths)


def test_verify_rows_from_threads(tmp_path):
    ds = tf.open(tf.write(_big_rows(300), tmp_path / "ds", shard_rows=50), max_open=2)
    errors = []

    def work(seed):
        try:
            for a in range(seed, 300, 7):
                ds.verify_rows([a, (a * 13) % 300])
                assert ds[a]["i"] == a
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    ds.verify_rows(list(range(300)))
    assert ds._verified_leaves == {"i", "b"}


# ---- 8. write_parallel workers die with their parent ---------------------------------------------------------------
PARENT = textwrap.dedent("""
    import os, sys, time
    import tbl_format as tf

    def part(i):
        open(os.path.join(sys.argv[2], f"ready-{i}-{os.getpid()}"), "w").close()
        time.sleep(120)
        return []

    if __name__ == "__main__":
        tf.write_parallel(part, 2, os.path.join(sys.argv[2], "out"), workers=2, mp_context=sys.argv[1])
""")


def _marked_alive(marker: str) -> list[int]:
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in env and state != "Z":
            alive.append(int(pid))
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_write_parallel_workers_die_with_their_parent(tmp_path, context):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    marker = f"TBL_TEST_MARK_{os.getpid()}_{context}"
    env = {**os.environ, marker: "1"}
    parent = subprocess.Popen([sys.executable, str(script), context, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < 2:
            assert parent.poll() is None, "the parent exited early"
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        assert len(_marked_alive(marker)) >= 3  # the parent and two workers at least
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _marked_alive(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked_alive(marker) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _marked_alive(marker):
            os.kill(pid, 9)


def test_die_with_parent_is_harmless_in_a_live_process():
    tf.parallel.die_with_parent(os.getppid())  # the parent is alive: the worker goes on


# ---- 9. free disk space ----------------------------------------------------------------------------------------------
class _Statvfs:
    def __init__(self, free):
        self.f_bavail, self.f_frsize = free, 1


@pytest.mark.parametrize("sharded", [False, True])
def test_full_disk_fails_early_with_how_much_and_where(tmp_path, monkeypatch, sharded):
    dst = tmp_path / ("ds" if sharded else "x.tbl")
    kw = {"shard_rows": 10_000} if sharded else {}
    monkeypatch.setattr(fsutil.os, "statvfs", lambda path: _Statvfs(50_000))
    w = tf.Writer(dst, **kw)
    with pytest.raises(tf.InsufficientSpaceError) as info:
        for i in range(5000):
            w.write({"i": i, "s": "y" * 100})
    w.abort()
    exc = info.value
    assert exc.available == 50_000 and exc.needed > 50_000 and isinstance(exc, OSError)
    assert str(tmp_path) in str(exc) and "MiB" in str(exc)
    assert i < 2000  # at the first check, not after every row
    assert not [p for p in tmp_path.rglob("*") if ".tbl-tmp-" in p.name]


def test_full_disk_before_assembly(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil.os, "statvfs", lambda path: _Statvfs(1000))
    with pytest.raises(tf.InsufficientSpaceError, match="assembling x.tbl needs"):
        tf.write(rows(0, 10), tmp_path / "x.tbl")
    assert list(tmp_path.iterdir()) == []
