"""Real-photo test images for the conversion tests, built from scikit-image's sample photographs.

Every helper is deterministic (seeded) so failures reproduce.
"""

from __future__ import annotations

import io
import tarfile
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
