"""Compare the pip-installable JPEG decoders a loader can use at serve time, on real photos.

    python -m tbl_bench.jpeg_decoders photos.tar [--images 2000] [--max-size 256] [--threads 2]

The JPEGs of the TAR are first brought to what ``tbl convert --store jpeg
--max-size N`` stores (longer side capped at N, quality 90). Each decoder then
decodes all of them at full scale and at DCT scale 1/2, once in one thread and
once in ``--threads`` threads (which shows whether it releases the GIL), each
configuration in its own subprocess. Candidates: Pillow's bundled libjpeg-turbo
(``Image.draft``) and simplejpeg (``min_height`` / ``min_width``).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["main"]

DECODERS = ("pillow", "simplejpeg")


def _prepare(tar_path: str, images: int, max_size: int, out: Path) -> None:
    from PIL import Image

    blobs = []
    with tarfile.open(tar_path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            with Image.open(tar.extractfile(member)) as img:
                img = img.convert("RGB")
                w, h = img.size
                if max(w, h) > max_size:
                    long_, short = max(w, h), min(w, h)
                    short = max(1, (2 * short * max_size + long_) // (2 * long_))
                    img = img.resize((max_size, short) if w >= h else (short, max_size), Image.Resampling.BILINEAR)
                buf = io.BytesIO()
                img.save(buf, "JPEG", quality=90)
                blobs.append(buf.getvalue())
            if len(blobs) == images:
                break
    with open(out, "wb") as f:
        for b in blobs:
            f.write(len(b).to_bytes(8, "little"))
            f.write(b)


def _load(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    blobs, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 8], "little")
        blobs.append(data[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return blobs


def _decoder(name: str, scale: int):
    if name == "pillow":
        import numpy as np
        from PIL import Image

        def decode(b: bytes):
            with Image.open(io.BytesIO(b)) as img:
                if scale > 1:
                    w, h = img.size
                    img.draft("RGB", (max(1, w // scale), max(1, h // scale)))
                img.load()
                return np.asarray(img)

        return decode
    import simplejpeg

    def decode_sj(b: bytes):
        if scale == 1:
            return simplejpeg.decode_jpeg(b, "RGB")
        h, w, _, _ = simplejpeg.decode_jpeg_header(b)
        return simplejpeg.decode_jpeg(b, "RGB", min_height=-(-h // scale), min_width=-(-w // scale))

    return decode_sj


def _child(path: str, name: str, scale: int, threads: int, repeats: int) -> dict:
    blobs = _load(path)
    decode = _decoder(name, scale)
    for b in blobs[:50]:
        decode(b)
    times = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            if threads == 1:
                for b in blobs:
                    decode(b)
            else:
                list(pool.map(decode, blobs, chunksize=16))
            times.append(time.perf_counter() - t)
    best = sorted(times)[len(times) // 2]
    return {"decoder": name, "scale": scale, "threads": threads, "images": len(blobs),
            "images_per_s": len(blobs) / best}


def _versions() -> dict:
    import PIL
    from PIL import features

    out = {"pillow": PIL.__version__, "pillow_libjpeg_turbo": features.version("libjpeg_turbo")}
    try:
        import simplejpeg

        out["simplejpeg"] = simplejpeg.__version__
    except ImportError:
        out["simplejpeg"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.jpeg_decoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tar", nargs="?", help="ImageNet-layout TAR of JPEGs (python -m tbl_bench.sample)")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--max-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", nargs=4, metavar=("BLOBS", "DECODER", "SCALE", "THREADS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        blobs, name, scale, threads = args.child
        print(json.dumps(_child(blobs, name, int(scale), int(threads), args.repeats)))
        return 0
    if args.tar is None:
        p.error("give the TAR")
    print(json.dumps(_versions()))
    with tempfile.TemporaryDirectory() as tmp:
        blobs = Path(tmp) / "blobs.bin"
        _prepare(args.tar, args.images, args.max_size, blobs)
        for name in DECODERS:
            for scale in (1, 2):
                for threads in sorted({1, args.threads}):
                    cmd = [sys.executable, "-m", "tbl_bench.jpeg_decoders", "--repeats", str(args.repeats),
                           "--child", str(blobs), name, str(scale), str(threads)]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    print(out.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
