"""Benchmark data: an ImageNet-layout TAR of real photographs, and pytree rows.

Images are derived from the real photographs shipped inside scikit-image and
scikit-learn (no download; the `photos` extra installs both): each sample is a random crop of one photo, resized
to a random size in the configured range, maybe mirrored, and JPEG re-encoded at
a random quality. Decoding such files costs what decoding camera photos costs
(natural image statistics, real chroma subsampling), unlike noise or flat
colours. Every draw is a pure function of (seed, sample index), so the same
arguments always give byte-identical files, whatever the number of workers.

Layout: `n{label:08d}/n{label:08d}_{index:07d}.JPEG` (ImageNet train style: the
directory names the class), written in index order with fixed TAR metadata.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import tarfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "ARRAY_ROWS",
    "SCALAR_ROWS",
    "SOURCE_PHOTOS",
    "ImageTarInfo",
    "PhotosUnavailableError",
    "array_rows",
    "class_name",
    "load_source_photos",
    "make_image_tar",
    "read_tar_labels",
    "scalar_rows",
]

# (module, name) of every photograph used; all ship with the installed packages.
SOURCE_PHOTOS = (
    ("skimage", "astronaut"),
    ("skimage", "coffee"),
    ("skimage", "chelsea"),
    ("skimage", "rocket"),
    ("skimage", "immunohistochemistry"),
    ("skimage", "hubble_deep_field"),
    ("skimage", "retina"),
    ("skimage", "stereo_motorcycle"),
    ("sklearn", "china"),
    ("sklearn", "flower"),
)

SCALAR_ROWS = 80_000
ARRAY_ROWS = 1_000_000


class GeneratorError(ValueError):
    """Bad arguments to a data generator."""


PHOTOS_INSTALL = "pip install 'tbl-bench[photos]'  (from a checkout: pip install './packages/tbl-bench[photos]')"


class PhotosUnavailableError(ImportError):
    """The source photographs' packages (scikit-image, scikit-learn: the `photos` extra) are not installed."""

    def __init__(self, missing: str) -> None:
        super().__init__(f"the sample photos need {missing}, which is not installed; install the photos extra: "
                         f"{PHOTOS_INSTALL}")
        self.missing = missing


def _require_photo_packages() -> None:
    for module, dist in (("skimage", "scikit-image"), ("sklearn", "scikit-learn")):
        if importlib.util.find_spec(module) is None:
            raise PhotosUnavailableError(dist)


def class_name(label: int) -> str:
    """ImageNet-style directory name of a class index."""
    return f"n{label:08d}"


def _sklearn_sample_image(name: str) -> np.ndarray:
    """One of scikit-learn's sample images, read as `sklearn.datasets.load_sample_images` reads it.

    The JPEG is read straight from the installed package: importing sklearn.datasets
    pulls in scipy and takes seconds, for two files that PIL decodes in milliseconds.
    """
    from PIL import Image

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise PhotosUnavailableError("scikit-learn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "images" / f"{name}.jpg"
    if not path.is_file():
        raise GeneratorError(f"scikit-learn sample image {path} is missing")
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


@functools.cache
def load_source_photos() -> tuple[np.ndarray, ...]:
    """The source photographs as read-only (H, W, 3) uint8 arrays, in SOURCE_PHOTOS order (loaded once).

    Raises PhotosUnavailableError, naming the pip command, without the `photos` extra.
    """
    _require_photo_packages()
    import skimage.data  # optional (the `photos` extra), checked just above

    photos = []
    for module, name in SOURCE_PHOTOS:
        if module == "skimage":
            img = getattr(skimage.data, name)()
            if isinstance(img, tuple):  # stereo pairs: the left view
                img = img[0]
        else:
            img = _sklearn_sample_image(name)
        img = np.asarray(img)
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise GeneratorError(f"source photo {module}.{name} is {img.shape} {img.dtype}, not (H, W, 3) uint8")
        img = np.ascontiguousarray(img)
        img.flags.writeable = False
        photos.append(img)
    return tuple(photos)


@dataclass(frozen=True)
class ImageTarInfo:
    path: Path
    count: int
    num_classes: int
    labels: list[int]
    bytes: int


# Worker state: the decoded source photos, set once per worker process.
_PHOTOS: tuple[np.ndarray, ...] | None = None


def _init_worker(photos: tuple[np.ndarray, ...]) -> None:
    global _PHOTOS
    _PHOTOS = photos


def _draw_label(seed: int, index: int, num_classes: int) -> int:
    return int(np.random.default_rng([seed, index, 1]).integers(num_classes))


def _render(seed: int, index: int, min_size: int, max_size: int) -> bytes:
    """One JPEG: a random crop of a random source photo, resized, maybe mirrored, re-encoded."""
    from PIL import Image

    assert _PHOTOS is not None, "worker not initialised"
    rng = np.random.default_rng([seed, index, 0])
    src = _PHOTOS[int(rng.integers(len(_PHOTOS)))]
    out_w = int(rng.integers(min_size, max_size + 1))
    out_h = int(rng.integers(min_size, max_size + 1))
    sh, sw = src.shape[:2]
    # Crop with the output's aspect ratio, covering 25% to 100% of the largest such box.
    aspect = out_w / out_h
    box_w, box_h = (sw, sw / aspect) if sw / sh < aspect else (sh * aspect, sh)
    frac = float(np.sqrt(rng.uniform(0.25, 1.0)))
    cw, ch = max(8, int(box_w * frac)), max(8, int(box_h * frac))
    x0 = int(rng.integers(0, sw - cw + 1))
    y0 = int(rng.integers(0, sh - ch + 1))
    img = Image.fromarray(src[y0 : y0 + ch, x0 : x0 + cw]).resize((out_w, out_h), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    quality = int(rng.integers(70, 96))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _render_chunk(args: tuple[int, int, int, int, int]) -> list[bytes]:
    seed, start, stop, min_size, max_size = args
    return [_render(seed, i, min_size, max_size) for i in range(start, stop)]


def _tar_member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0  # fixed metadata: same arguments, same bytes
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def make_image_tar(
    dst: str | os.PathLike,
    n: int = 2000,
    *,
    num_classes: int = 100,
    min_size: int = 250,
    max_size: int = 500,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
) -> ImageTarInfo:
    """Write an ImageNet-layout TAR of `n` real-photo JPEGs to `dst`; return what was written.

    The file is written under a temporary name and renamed into place, so an
    interrupted run leaves no half-written TAR under `dst`.
    """
    if n < 1:
        raise GeneratorError(f"n must be >= 1, got {n}")
    if num_classes < 1:
        raise GeneratorError(f"num_classes must be >= 1, got {num_classes}")
    if not 8 <= min_size <= max_size:
        raise GeneratorError(f"need 8 <= min_size <= max_size, got {min_size}, {max_size}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    photos = load_source_photos()
    labels = [_draw_label(seed, i, num_classes) for i in range(n)]
    chunk = 64
    jobs = [(seed, s, min(s + chunk, n), min_size, max_size) for s in range(0, n, chunk)]
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="img", desc=f"generating {dst.name}")
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            if workers <= 1:
                _init_worker(photos)
                chunks: Iterator[list[bytes]] = map(_render_chunk, jobs)
                pool = None
            else:
                pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(photos,))
                chunks = pool.map(_render_chunk, jobs)
            try:
                index = 0
                for blobs in chunks:
                    for blob in blobs:
                        cls = class_name(labels[index])
                        info = _tar_member(f"{cls}/{cls}_{index:07d}.JPEG", len(blob))
                        tar.addfile(info, io.BytesIO(blob))
                        index += 1
                    if bar is not None:
                        bar.update(len(blobs))
            finally:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return ImageTarInfo(dst, n, num_classes, labels, dst.stat().st_size)


def read_tar_labels(path: str | os.PathLike) -> tuple[list[str], list[int]]:
    """Member names and class indices (from the `nXXXXXXXX/` directory) of a TAR, in order."""
    names, labels = [], []
    with tarfile.open(path) as tar:
        for m in tar:
            if not m.isfile():
                continue
            cls = m.name.split("/", 1)[0]
            if not (len(cls) == 9 and cls[0] == "n" and cls[1:].isdigit()):
                raise GeneratorError(f"{path}: member {m.name!r} is not under an nXXXXXXXX/ class directory")
            names.append(m.name)
            labels.append(int(cls[1:]))
    return names, labels


def scalar_rows(n: int = SCALAR_ROWS, *, seed: int = 0) -> Iterator[dict]:
    """`n` rows of {int, float, str, bool}: the small-record pytree workload."""
    if n < 0:
        raise GeneratorError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng([seed, 2])
    ids = rng.integers(-(2**40), 2**40, size=n)
    scores = rng.standard_normal(n)
    flags = rng.random(n) < 0.5
    lengths = rng.integers(0, 24, size=n)
    for i in range(n):
        yield {
            "id": int(ids[i]),
            "score": float(scores[i]),
            "name": f"row-{i:07d}-" + "x" * int(lengths[i]),
            "flag": bool(flags[i]),
        }


def array_rows(n: int = ARRAY_ROWS, *, seed: int = 0, chunk: int = 65_536) -> Iterator[dict]:
    """`n` rows of {(64,) float32 array, str, int}: the embedding-table pytree workload."""
    if n < 0:
        raise GeneratorError(f"n must be >= 0, got {n}")
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        rng = np.random.default_rng([seed, 3, start])
        emb = rng.standard_normal((stop - start, 64), dtype=np.float32)
        for j in range(stop - start):
            i = start + j
            yield {"embedding": emb[j], "key": f"item-{i:08d}", "id": i}
