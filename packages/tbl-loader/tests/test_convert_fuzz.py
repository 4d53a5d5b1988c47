"""Fuzz `tbl convert` over random hostile source trees: no hang, no traceback, nothing outside DST changed.

Each case builds a seeded random tree of valid and corrupt images, FIFOs, sockets, symlinks (to files,
to folders, loops, out of the tree, broken, to /dev/zero) and huge sparse files, then runs the CLI in a
subprocess under a timeout with random options, and checks:

- it ends within the timeout (0 hangs) and prints no traceback;
- the exit code is one of the documented ones, and its outcome holds: 0 and 1 published a dataset
  that opens with as many rows as the report says were written; 2 and 3 published nothing;
- no file outside the destination (and its report) changed: checksums of the whole tree before
  and after.

A few cases run by default; ``TBL_FUZZ_CONVERT_CASES=500`` runs that many (seeds 0..N-1), and
``TBL_FUZZ_CONVERT_SEED`` shifts the seeds.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from convert_images import cli_argv, jpeg, make_socket, sparse_file, tree_state

import tbl_format

CASES = int(os.environ.get("TBL_FUZZ_CONVERT_CASES", "6"))
SEED0 = int(os.environ.get("TBL_FUZZ_CONVERT_SEED", "0"))
TIMEOUT = 90
EXIT_CODES = {0, 1, 2, 3}


def corrupt(rng: random.Random, data: bytes) -> bytes:
    kind = rng.choice(["truncate", "flip", "garbage", "empty", "header"])
    if kind == "truncate":
        return data[: rng.randrange(1, len(data))]
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == "garbage":
        return rng.randbytes(rng.randrange(1, 4000))
    if kind == "empty":
        return b""
    return data[:20]


def build_tree(rng: random.Random, base: Path) -> Path:
    """A random source folder under base/src; base/outside holds what links may reach out of the tree."""
    src, outside = base / "src", base / "outside"
    outside.mkdir()
    (outside / "o.jpg").write_bytes(jpeg(rng.randrange(1000)))
    (outside / "sub").mkdir()
    (outside / "sub" / "p.jpg").write_bytes(jpeg(rng.randrange(1000)))
    dirs = [src / f"c{i}" for i in range(rng.randrange(1, 4))]
    for d in dirs:
        d.mkdir(parents=True)
    for _ in range(rng.randrange(0, 3)):
        sub = rng.choice(dirs) / f"sub{rng.randrange(100)}"
        sub.mkdir(exist_ok=True)
        dirs.append(sub)
    files: list[Path] = []
    for n in range(rng.randrange(3, 14)):
        d = rng.choice(dirs)
        name = d / f"f{n}{rng.choice(['.jpg', '.JPEG', '.png', '.txt', '.jpg'])}"
        kind = rng.choices(
            ["good", "corrupt", "fifo", "socket", "link_file", "link_dir", "loop", "broken", "devzero", "sparse",
             "outside"],
            weights=[8, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        )[0]
        try:
            if kind == "good":
                name.write_bytes(jpeg(rng.randrange(1000)))
                files.append(name)
            elif kind == "corrupt":
                name.write_bytes(corrupt(rng, jpeg(rng.randrange(1000))))
            elif kind == "fifo":
                os.mkfifo(name)
            elif kind == "socket":
                make_socket(name)
            elif kind == "link_file" and files:
                os.symlink(os.path.relpath(rng.choice(files), d), name)
            elif kind == "link_dir":
                target = rng.choice([src, *dirs])
                os.symlink(os.path.relpath(target, d), d / f"dirlink{n}")
            elif kind == "loop":
                os.symlink(".", d / f"loop{n}")
                if rng.random() < 0.5:
                    os.symlink("..", d / f"up{n}")
            elif kind == "broken":
                os.symlink(f"missing{n}.jpg", name)
            elif kind == "devzero":
                os.symlink("/dev/zero", name)
            elif kind == "sparse":
                sparse_file(name, rng.choice([300 << 20, 5 << 30]))
            elif kind == "outside":
                os.symlink(rng.choice([outside / "o.jpg", outside / "sub"]), d / f"out{n}")
        except OSError:
            pass
    return src


def check_case(seed: int, base: Path) -> None:
    rng = random.Random(seed)
    src = build_tree(rng, base)
    where = rng.choice(["file", "shards", "existing", "inside_src"])
    if where == "inside_src":
        dst = src / "c0" / "out.tbl"
    elif where == "shards":
        dst = base / "ds"
    else:
        dst = base / "out.tbl"
    argv = [str(src), str(dst), "--size", str(rng.choice([8, 16, 24])), "--quiet",
            "--workers", str(rng.choice([1, 2])), "--on-error", rng.choice(["fail", "skip"])]
    if where == "shards":
        argv += ["--shard-rows", str(rng.randrange(1, 5))]
    if rng.random() < 0.3:
        argv += ["--max-image-bytes", str(rng.choice([100, 2000, 1 << 20]))]
    if where == "existing":
        dst.write_text("precious, not a dataset")
        argv.append("--force")
    report = Path(f"{dst}.report.json")
    before = tree_state(base, skip={dst, report})
    try:
        result = subprocess.run(cli_argv(*argv), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"seed {seed}: tbl convert {' '.join(argv)} hung for {TIMEOUT} s")
    what = f"seed {seed}: tbl convert {' '.join(argv)} -> {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout, what
    assert result.returncode in EXIT_CODES, what
    assert tree_state(base, skip={dst, report}) == before, what
    if where == "existing":
        assert dst.read_text() == "precious, not a dataset" and result.returncode == 2, what
    elif result.returncode in (0, 1):
        rep = json.loads(report.read_text())
        ds = tbl_format.open(dst)
        try:
            assert len(ds) == rep["written"], what
        finally:
            ds.close()
    else:
        assert not dst.exists(), what
    hidden = [p for p in dst.parent.iterdir() if p.name.startswith(".") and ".tbl-tmp-" in p.name]
    assert hidden == [], what


@pytest.mark.parametrize("seed", range(SEED0, SEED0 + CASES))
def test_fuzz_cli(tmp_path: Path, seed: int) -> None:
    faulthandler.dump_traceback_later(TIMEOUT * 2, exit=True)
    try:
        check_case(seed, tmp_path)
    finally:
        faulthandler.cancel_dump_traceback_later()
