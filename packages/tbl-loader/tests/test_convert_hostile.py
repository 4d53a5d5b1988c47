"""tbl convert on hostile inputs: FIFOs and devices, symlink loops, huge files, unsafe destinations, full disks.

Each case asserts the named error or the defined outcome; CLI runs are subprocesses with a timeout and
must print no traceback. In-process runs are guarded by a faulthandler timeout, so a hang fails the
run instead of stalling it.
"""

from __future__ import annotations

import faulthandler
import importlib
import io
import json
import os
import stat
import subprocess
import tarfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from convert_images import (
    error_lines,
    good_tree,
    jpeg,
    make_socket,
    run_cli,
    sparse_file,
    sparse_tar,
    tree_state,
)

import tbl_format
from tbl_loader.conversion.images import convert
from tbl_loader.conversion.sources import DEFAULT_MAX_IMAGE_BYTES, read_file
from tbl_loader.errors import (
    DestinationError,
    ImageDecodeError,
    ImageTooLargeError,
    SourceError,
    WorkerCrashError,
)

S = 16
conv = importlib.import_module("tbl_loader.conversion.images")  # the package's `convert` hides the submodule
conv_sources = importlib.import_module("tbl_loader.conversion.sources")


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def rows(path: Path) -> int:
    ds = tbl_format.open(path)
    try:
        return len(ds)
    finally:
        ds.close()


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- FIFOs, sockets, devices


@pytest.fixture()
def special_tree(tmp_path: Path) -> Path:
    root = good_tree(tmp_path / "src")
    os.mkfifo(root / "c0" / "pipe.jpg")
    os.symlink("/dev/zero", root / "c1" / "zero.jpg")
    make_socket(root / "c1" / "sock.png")
    return root


@pytest.mark.parametrize("workers", [1, 2])
def test_non_regular_images_are_bad_rows_never_opened(tmp_path: Path, special_tree: Path, workers: int) -> None:
    rep = convert(special_tree, tmp_path / "out.tbl", S, workers=workers, on_error="skip", progress=False)
    why = {e.name: e.message for e in rep.errors}
    assert "FIFO" in why["c0/pipe.jpg"] and "never opened" in why["c0/pipe.jpg"]
    assert "character device" in why["c1/zero.jpg"]
    if (special_tree / "c1" / "sock.png").exists():
        assert "socket" in why["c1/sock.png"]
    assert rep.written == 6 and rows(tmp_path / "out.tbl") == 6
    assert "c0/pipe.jpg" in rep.summary()
    with pytest.raises(ImageDecodeError, match="pipe.jpg"):
        convert(special_tree, tmp_path / "fail.tbl", S, workers=workers, progress=False)
    assert not (tmp_path / "fail.tbl").exists()


def test_cli_non_regular_images(tmp_path: Path, special_tree: Path) -> None:
    r = run_cli(str(special_tree), str(tmp_path / "a.tbl"), "--size", str(S), "--workers", "2", "--quiet")
    assert r.returncode == 3 and "pipe.jpg" in r.stderr and not (tmp_path / "a.tbl").exists()
    assert len(error_lines(r.stderr)) == 1
    r = run_cli(str(special_tree), str(tmp_path / "b.tbl"), "--size", str(S), "--on-error", "skip", "--quiet")
    assert r.returncode == 1 and "c0/pipe.jpg" in r.stderr and "c1/zero.jpg" in r.stderr
    assert rows(tmp_path / "b.tbl") == 6
    report = json.loads((tmp_path / "b.tbl.report.json").read_text())
    assert {e["name"] for e in report["errors"]} >= {"c0/pipe.jpg", "c1/zero.jpg"}


def test_fifo_or_device_as_source_or_label_file(tmp_path: Path) -> None:
    fifo = tmp_path / "src.tar"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match="FIFO"):
        convert(fifo, tmp_path / "x.tbl", S, progress=False)
    r = run_cli(str(fifo), str(tmp_path / "x.tbl"), "--size", str(S), timeout=60)
    assert r.returncode == 2 and "FIFO" in r.stderr and len(error_lines(r.stderr)) == 1
    r = run_cli("/dev/zero", str(tmp_path / "x.tbl"), "--size", str(S), timeout=60)
    assert r.returncode == 2 and "character device" in r.stderr
    tar = tmp_path / "flat.tar"
    with tarfile.open(tar, "w") as tf:
        data = jpeg(1)
        info = tarfile.TarInfo("a.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    labels = tmp_path / "labels.csv"
    os.mkfifo(labels)
    with pytest.raises(SourceError, match="label file.*FIFO"):
        convert(tar, tmp_path / "x.tbl", S, label_file=labels, progress=False)
    assert not (tmp_path / "x.tbl").exists()


# ---------------------------------------------------------------- symlinks


def test_symlink_loops_end_and_every_file_is_stored_once(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src")
    (root / "c0" / "deep").mkdir()
    (root / "c0" / "deep" / "d.jpg").write_bytes(jpeg(50))
    os.symlink(".", root / "c0" / "self")  # one loop
    os.symlink("..", root / "c0" / "deep" / "up")  # a second loop, through a parent
    os.symlink("..", root / "c1" / "root")  # to the root: every class again
    os.symlink("../c0", root / "c1" / "other_class")  # another class's folder
    os.symlink("../c0/img0.jpg", root / "c1" / "alias.jpg")  # a second name of one file
    os.link(root / "c0" / "img1.jpg", root / "c1" / "hard.jpg")  # a hard link too
    os.symlink("nowhere.jpg", root / "c1" / "broken.jpg")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "o.jpg").write_bytes(jpeg(60))
    os.symlink(outside, root / "c1" / "ext")  # out of the tree: followed (targets are only read)
    rep = convert(root, tmp_path / "out.tbl", S, workers=1, on_error="skip", progress=False)
    skipped = {e.name: e.message for e in rep.skipped}
    assert "symlink loop" in skipped["c0/self/"] and "symlink loop" in skipped["c0/deep/up/"]
    assert "c1/root/" in skipped and "c1/other_class/" in skipped
    assert "same file as 'c0/img0.jpg'" in skipped["c1/alias.jpg"]
    assert "same file as 'c0/img1.jpg'" in skipped["c1/hard.jpg"]
    assert [e.name for e in rep.errors] == ["c1/broken.jpg"]
    assert rep.written == 6 + 1 + 1  # the tree, c0/deep/d.jpg, c1/ext/o.jpg
    ds = tbl_format.open(tmp_path / "out.tbl")
    try:
        labels = [int(ds[i]["label"]) for i in range(len(ds))]
    finally:
        ds.close()
    assert labels == [0, 0, 0, 0, 1, 1, 1, 1]  # c0/deep/d, c0/img0..2 | c1/ext/o, c1/img0..2


def test_two_loops_cli_ends(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src", per_class=2)
    for c in ("c0", "c1"):
        os.symlink(".", root / c / "l1")
        os.symlink(".", root / c / "l2")
        os.symlink("..", root / c / "l3")
    r = run_cli(str(root), str(tmp_path / "o.tbl"), "--size", str(S), "--workers", "1", "--quiet", timeout=60)
    assert r.returncode == 1 and "symlink loop" in r.stderr
    assert rows(tmp_path / "o.tbl") == 4


# ---------------------------------------------------------------- size cap


def test_huge_sparse_file_and_tar_member_are_bad_rows(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src")
    sparse_file(root / "c0" / "huge.jpg", DEFAULT_MAX_IMAGE_BYTES + 1)
    rep = convert(root, tmp_path / "a.tbl", S, workers=2, on_error="skip", progress=False)
    assert [e.name for e in rep.errors] == ["c0/huge.jpg"] and "cap" in rep.errors[0].message
    with pytest.raises(ImageDecodeError, match="huge.jpg.*cap"):
        convert(root, tmp_path / "b.tbl", S, workers=1, progress=False)
    members = {f"c{i % 2}/img{i}.jpg": jpeg(i) for i in range(4)}
    tar = sparse_tar(tmp_path / "huge.tar", members, {"c1/huge.jpg": 3 << 30})
    rep = convert(tar, tmp_path / "c.tbl", S, workers=1, on_error="skip", progress=False)
    assert [e.name for e in rep.errors] == ["c1/huge.jpg"] and rep.written == 4
    r = run_cli(str(tar), str(tmp_path / "d.tbl"), "--size", str(S), "--quiet", timeout=60)
    assert r.returncode == 3 and "huge.jpg" in r.stderr
    # a small cap from the CLI: every image is over it
    r = run_cli(str(root), str(tmp_path / "e.tbl"), "--size", str(S), "--max-image-bytes", "100", "--on-error",
                "skip", "--quiet", timeout=60)
    assert r.returncode == 1 and "100-byte cap" in r.stderr and rows(tmp_path / "e.tbl") == 0
    r = run_cli(str(root), str(tmp_path / "f.tbl"), "--size", str(S), "--max-image-bytes", "lots", timeout=60)
    assert r.returncode == 2


def test_reading_never_holds_more_than_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (8 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ImageTooLargeError):
            read_file(big, max_bytes=1 << 20)  # refused from its size: nothing read
        assert tracemalloc.get_traced_memory()[1] < 64 << 10
        tracemalloc.reset_peak()
        fd = os.open(big, os.O_RDONLY)
        try:
            with pytest.raises(ImageTooLargeError):
                conv_sources._read_capped(fd, 0, 1 << 20)  # a size that lies (a file that grows)
        finally:
            os.close(fd)
        assert tracemalloc.get_traced_memory()[1] < (1 << 20) + (256 << 10)
    finally:
        tracemalloc.stop()
    assert read_file(big, max_bytes=8 << 20) == b"x" * (8 << 20)


# ---------------------------------------------------------------- destination


def test_destination_devices_fifos_links_and_self(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    r = run_cli(str(root), str(fifo), "--size", str(S), "--force", timeout=60)
    assert r.returncode == 2 and "FIFO" in r.stderr and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    try:
        node = tmp_path / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        node = None
    if node is not None:
        r = run_cli(str(root), str(node), "--size", str(S), "--force", timeout=60)
        assert r.returncode == 2 and "character device" in r.stderr and stat.S_ISCHR(os.lstat(node).st_mode)
    tar = tmp_path / "x.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root, arcname=".")
    before = tar.read_bytes()
    for dst in (tar, tmp_path / "link.tar"):
        if dst.name == "link.tar":
            os.symlink(tar, dst)
        with pytest.raises(DestinationError):
            convert(tar, dst, S, overwrite=True, progress=False)
        r = run_cli(str(tar), str(dst), "--size", str(S), "--force", timeout=60)
        assert r.returncode == 2 and len(error_lines(r.stderr)) == 1
    r = run_cli(str(tmp_path / "link.tar"), str(tar), "--size", str(S), "--force", timeout=60)
    assert r.returncode == 2 and "is the source" in r.stderr
    assert tar.read_bytes() == before and os.path.islink(tmp_path / "link.tar")
    with pytest.raises(DestinationError, match="is the source"):
        convert(root, root, S, shards=2, overwrite=True, progress=False)
    with pytest.raises(DestinationError, match="label file|is the source"):
        convert(root, tmp_path / "labels.csv", S, overwrite=True, progress=False,
                label_file=_labels(tmp_path / "labels.csv"))


def _labels(path: Path) -> Path:
    path.write_text("c0/img0.jpg,0\n")
    return path


def test_existing_destination_needs_force(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src")
    dst = tmp_path / "out.tbl"
    convert(root, dst, S, workers=1, progress=False)
    with pytest.raises(DestinationError, match="--force"):
        convert(root, dst, S, workers=1, progress=False)
    r = run_cli(str(root), str(dst), "--size", str(S), "--workers", "1", "--quiet")
    assert r.returncode == 2 and "--force" in r.stderr
    r = run_cli(str(root), str(dst), "--size", "8", "--workers", "1", "--quiet", "--force")
    assert r.returncode == 0
    ds = tbl_format.open(dst)
    assert ds.metadata["preprocess"]["size"] == 8
    ds.close()
    precious = tmp_path / "notes.txt"
    precious.write_text("not a dataset")
    r = run_cli(str(root), str(precious), "--size", str(S), "--force", "--quiet")
    assert r.returncode == 2 and "not a TBL" in r.stderr and precious.read_text() == "not a dataset"
    # a folder where a file is written, a file where a folder is, a folder named with a slash
    (tmp_path / "adir").mkdir()
    r = run_cli(str(root), str(tmp_path / "adir"), "--size", str(S), "--quiet")
    assert r.returncode == 2 and "is a folder" in r.stderr
    r = run_cli(str(root), str(dst), "--size", str(S), "--shards", "2", "--quiet", "--force")
    assert r.returncode == 2 and "is a file" in r.stderr
    r = run_cli(str(root), str(tmp_path / "new") + "/", "--size", str(S), "--quiet")
    assert r.returncode == 2 and not (tmp_path / "new").exists()
    # a parent that cannot be created
    r = run_cli(str(root), str(precious / "sub" / "x.tbl"), "--size", str(S), "--quiet")
    assert r.returncode == 2 and "notes.txt" in r.stderr and len(error_lines(r.stderr)) == 1


def test_force_replaces_only_the_dataset_own_shards(tmp_path: Path) -> None:
    root = good_tree(tmp_path / "src")
    dst = tmp_path / "ds"
    convert(root, dst, S, shard_rows=2, workers=1, progress=False)
    (dst / "notes.txt").write_text("mine")
    old = sorted(p.name for p in dst.glob("*.tbl"))
    convert(root, dst, 8, shard_rows=3, workers=1, progress=False, overwrite=True)
    assert not any((dst / n).exists() for n in old) and (dst / "notes.txt").read_text() == "mine"
    assert rows(dst) == 6
    # a shard reached through a link out of the folder, or a listed file that is not TBL: refused, all kept
    shard = sorted(dst.glob("*.tbl"))[0]
    outside = tmp_path / "outside.tbl"
    os.replace(shard, outside)
    os.symlink(outside, shard)
    before = tree_state(tmp_path)
    r = run_cli(str(root), str(dst), "--size", str(S), "--shard-rows", "2", "--force", "--quiet")
    assert r.returncode == 2 and "symlink" in r.stderr
    assert tree_state(tmp_path) == before
    os.unlink(shard)
    shard.write_text("not a shard")
    with pytest.raises(DestinationError):
        convert(root, dst, S, shard_rows=2, workers=1, progress=False, overwrite=True)
    assert shard.read_text() == "not a shard" and outside.is_file()


# ---------------------------------------------------------------- report, full disk


@pytest.fixture()
def small_mount(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "mnt"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_full_disk_publishes_nothing(tmp_path: Path, small_mount: Path) -> None:
    root = good_tree(tmp_path / "src", per_class=30)
    dst = small_mount / "big.tbl"  # 60 images of 128 x 128 x 3: about 3 MiB, more than the mount holds
    r = run_cli(str(root), str(dst), "--size", "128", "--workers", "1", "--quiet")
    # the writer's free-space check refuses it up front, or the disk fills: either way one line, code 3
    assert r.returncode == 3 and len(error_lines(r.stderr)) == 1, r.stderr
    assert "No space left" in r.stderr or str(small_mount) in r.stderr
    assert not dst.exists() and hidden(small_mount) == []


def test_fixed_size_conversion_needs_the_file_size_once(tmp_path: Path, small_mount: Path) -> None:
    # 30 images of 128 x 128 x 3 (1.4 MiB) on a 2 MiB mount: each image is written once, in its place in the
    # output, so the file fits; temp columns assembled into the file would need its size twice (2.8 MiB).
    root = good_tree(tmp_path / "src", per_class=15)
    for workers in ("1", "2"):
        dst = small_mount / f"fits-{workers}.tbl"
        r = run_cli(str(root), str(dst), "--size", "128", "--workers", workers, "--quiet")
        assert r.returncode == 0, r.stderr
        assert rows(dst) == 30 and hidden(small_mount) == []
        dst.unlink()


def test_unwritable_report_publishes_the_dataset(tmp_path: Path, small_mount: Path) -> None:
    root = good_tree(tmp_path / "src")
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    report = small_mount / "r.json"
    r = run_cli(str(root), str(tmp_path / "a.tbl"), "--size", str(S), "--report", str(report), "--quiet")
    assert r.returncode == 1 and rows(tmp_path / "a.tbl") == 6
    assert "report" in r.stderr and "could not be written" in r.stderr and "published" in r.stderr
    rep = convert(root, tmp_path / "b.tbl", S, workers=1, progress=False, report=report)
    assert rep.status == "ok" and "could not be written" in (rep.report_error or "")
    (tmp_path / "rdir").mkdir()
    r = run_cli(str(root), str(tmp_path / "c.tbl"), "--size", str(S), "--report", str(tmp_path / "rdir"))
    assert r.returncode == 2 and not (tmp_path / "c.tbl").exists()
    image = root / "c0" / "img0.jpg"
    before = image.read_bytes()
    r = run_cli(str(root), str(tmp_path / "c.tbl"), "--size", str(S), "--report", str(image))
    assert r.returncode == 2 and "not a conversion report" in r.stderr and not (tmp_path / "c.tbl").exists()
    assert image.read_bytes() == before
    convert(root, tmp_path / "d.tbl", S, workers=1, progress=False)
    r = run_cli(str(root), str(tmp_path / "c.tbl"), "--size", str(S), "--report", str(tmp_path / "d.tbl.report.json"))
    assert r.returncode == 0  # an earlier report is replaced
    assert json.loads((tmp_path / "d.tbl.report.json").read_text())["destination"] == str(tmp_path / "c.tbl")


# ---------------------------------------------------------------- worker faults (in process)


def test_broken_pool_on_submit_is_a_worker_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = good_tree(tmp_path / "src", per_class=10)
    real = conv.ProcessPoolExecutor.submit
    calls = {"n": 0}

    def submit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise conv.BrokenProcessPool("a worker died")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(conv.ProcessPoolExecutor, "submit", submit)
    with pytest.raises(WorkerCrashError, match="nothing was published"):
        convert(root, tmp_path / "out.tbl", S, workers=2, progress=False)
    assert not (tmp_path / "out.tbl").exists() and hidden(tmp_path) == []
