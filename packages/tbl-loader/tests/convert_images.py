"""Test inputs for the conversion tests: real-photo images built from scikit-image's sample photographs,
and hostile trees (FIFOs, sparse files, sparse TARs), a CLI runner, process lists and tree checksums.

Every helper is deterministic (seeded) so failures reproduce. Every run of the CLI has a timeout and
fails the test on a traceback; nothing here ever opens a FIFO.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def photos() -> list[np.ndarray]:
    """scikit-image's colour sample photographs, (H, W, 3) uint8."""
    from skimage import data

    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]


def encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def random_crop(rng: np.random.Generator, photo: np.ndarray, lo: int, hi: int) -> Image.Image:
    """A random crop of the photo resized to a random size with sides in [lo, hi]."""
    h, w = photo.shape[:2]
    ch, cw = rng.integers(h // 3, h + 1), rng.integers(w // 3, w + 1)
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    out = (int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1)))
    return Image.fromarray(photo[y : y + ch, x : x + cw]).resize(out, Image.Resampling.BICUBIC)


def variants(seed: int = 0, lo: int = 40, hi: int = 200) -> dict[str, bytes]:
    """One file per colour case the decoder must handle: name -> encoded bytes."""
    rng = np.random.default_rng(seed)
    ph = photos()
    base = random_crop(rng, ph[0], lo, hi)
    out: dict[str, bytes] = {
        "rgb.jpg": encode(random_crop(rng, ph[1], lo, hi), "JPEG", quality=90),
        "progressive.jpg": encode(random_crop(rng, ph[2], lo, hi), "JPEG", quality=80, progressive=True),
        "big.jpg": encode(random_crop(rng, ph[3], 3 * hi, 4 * hi), "JPEG", quality=85),
        "grey.jpg": encode(base.convert("L"), "JPEG", quality=90),
        "cmyk.jpg": encode(base.convert("CMYK"), "JPEG", quality=90),
        "rgb.png": encode(base, "PNG"),
        "palette.png": encode(base.quantize(64), "PNG"),
    }
    pal = base.quantize(32)
    out["palette_transparent.png"] = encode(pal, "PNG", transparency=0)
    rgba = base.convert("RGBA")
    alpha = np.asarray(rgba).copy()
    alpha[..., 3] = np.linspace(0, 255, alpha.shape[1], dtype=np.uint8)[None, :]
    out["rgba.png"] = encode(Image.fromarray(alpha, "RGBA"), "PNG")
    out["la.png"] = encode(Image.fromarray(alpha, "RGBA").convert("LA"), "PNG")
    grey16 = (np.asarray(base.convert("L")).astype(np.uint16) * 257 + rng.integers(0, 257, base.size[::-1])).astype(
        np.uint16
    )
    out["grey16.png"] = encode(Image.fromarray(grey16), "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    out["rotated.jpg"] = encode(random_crop(rng, ph[2], lo, hi), "JPEG", quality=90, exif=exif.tobytes())
    return out


def jpeg_set(n: int, seed: int = 0, lo: int = 40, hi: int = 120, quality: int = 85) -> list[bytes]:
    """n JPEGs: random crops/resizes of the sample photos."""
    rng = np.random.default_rng(seed)
    ph = photos()
    return [encode(random_crop(rng, ph[i % len(ph)], lo, hi), "JPEG", quality=quality) for i in range(n)]


def truncated_jpeg(seed: int = 1) -> bytes:
    full = jpeg_set(1, seed=seed, lo=120, hi=160)[0]
    return full[: len(full) // 2]


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def write_tar(path: Path, files: dict[str, bytes], *, gzip: bool = False, order: list[str] | None = None) -> Path:
    """A TAR of ``files`` (members in ``order``, default: as given), optionally gzip-compressed."""
    with tarfile.open(path, "w:gz" if gzip else "w") as tf:
        for rel in order if order is not None else list(files):
            info = tarfile.TarInfo(rel)
            info.size = len(files[rel])
            tf.addfile(info, io.BytesIO(files[rel]))
    return path


def write_bench_tar(path: Path, n: int = 2000, classes: int = 10, seed: int = 0) -> Path:
    """An ImageNet-layout TAR of n JPEGs (sides 250-500 px, quality 90) cut from the sample photos.

    Used for throughput measurements, e.g.
    ``python -c "import sys; sys.path.insert(0, 'packages/tbl-loader/tests'); import convert_images as c;
    from pathlib import Path; c.write_bench_tar(Path('/tmp/bench.tar'))"``
    """
    rng = np.random.default_rng(seed)
    ph = photos()
    files = {
        f"n{i % classes:08d}/img_{i:06d}.JPEG": encode(random_crop(rng, ph[i % len(ph)], 250, 500), "JPEG", quality=90)
        for i in range(n)
    }
    return write_tar(path, files)


# ---------------------------------------------------------------- hostile inputs

CLI_TIMEOUT = 120


def jpeg(seed: int, side: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((side, side + seed % 7), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def good_tree(root: Path, per_class: int = 3, classes: int = 2) -> Path:
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / f"c{c}" / f"img{i}.jpg").write_bytes(jpeg(c * 100 + i))
    return root


def sparse_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def sparse_tar(path: Path, members: dict[str, bytes], huge: dict[str, int]) -> Path:
    """A plain TAR of ``members`` plus members of the given sizes made of holes (no data written)."""
    with open(path, "wb") as f:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            f.write(data + b"\0" * (-len(data) % 512))
        for name, size in huge.items():
            info = tarfile.TarInfo(name)
            info.size = size
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            f.seek(size + (-size % 512), os.SEEK_CUR)
        f.write(b"\0" * 1024)
    return path


def make_socket(path: Path) -> bool:
    """A Unix socket file at ``path`` (closed at once; the file stays). False where not possible."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(str(path))
        finally:
            s.close()
    except (OSError, AttributeError):
        return False
    return True


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tbl_format.cli", "convert", *args]


def run_cli(*args: str, timeout: float = CLI_TIMEOUT, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``tbl convert ARGS``; fails on a hang (timeout) and on any traceback."""
    result = subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    return result


def error_lines(stderr: str) -> list[str]:
    """The CLI's own lines (the resource tracker of a killed pool may add warnings of its own)."""
    return [line for line in stderr.splitlines() if line.startswith("tbl convert:")]


# ---------------------------------------------------------------- processes (from /proc: no psutil needed)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = text.rsplit(")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int) -> set[int]:
    table = process_table()
    out: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _) in table.items():
            if ppid == parent and child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pids: set[int]) -> set[int]:
    table = process_table()
    return {p for p in pids if p in table and table[p][1] not in ("Z", "X")}


def wait_for_descendants(proc: subprocess.Popen, count: int, timeout: float = 60.0) -> set[int]:
    """Wait until ``proc`` has at least ``count`` live descendants; returns them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = alive(descendants(proc.pid))
        if len(found) >= count:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the conversion ended (rc {proc.returncode}) before {count} processes started")
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} processes started within {timeout} s")


def wait_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(pids)
    return left


def kill_all(pids: set[int]) -> None:
    for p in alive(pids):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- tree checksums


def tree_state(root: Path, skip: set[Path] = frozenset()) -> dict[str, tuple]:
    """What every entry under root is: type and link target, or a checksum of a regular file's bytes
    (size and mtime for files over 4 MiB, e.g. sparse ones). FIFOs and devices are never opened."""
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # links are not followed
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if any(p == s or s in p.parents for s in skip):
                continue
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                if st.st_size > 4 << 20:
                    state[rel] = ("big", st.st_size, st.st_mtime_ns, st.st_ino)
                else:
                    state[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode)
            else:
                state[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_ino)
    return state
