"""A seeded fuzz of serve-time JPEG rows, run as a script in its own process (so its peak RSS is its own).

``python jpeg_fuzz.py CASES SEED VERIFY`` builds CASES hostile JPEG rows from SEED (mutated bytes, rewritten
frame headers, height/width columns that lie, decompression bombs declared small, 12-bit and CMYK headers,
garbage, truncations, and bytes flipped inside the written shard), serves each row alone through an
ImageLoader with ``verify=VERIFY``, and prints one JSON object:

- ``crashes``: cases that raised anything but the named errors (ImageGeometryError, JpegDecodeError,
  tbl_format.DataChecksumError), with their repr;
- ``mismatches``: rows served although the size in their bytes (read by Pillow, and by simplejpeg's own
  header reader) is not their height/width columns;
- ``honest_refused``: unmodified rows that were refused;
- ``outcomes``: a count per (mutation, outcome);
- ``baseline_rss`` / ``peak_rss`` (bytes): ru_maxrss once the first honest case was served, and at the end;
- ``largest_declared`` (bytes): the largest ``height * width * 3`` of any row's columns;
- ``largest_bomb`` (bytes): the largest ``height * width * 3`` any row's frame header claims.
"""

from __future__ import annotations

import io
import json
import random
import resource
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image

import tbl_format
from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import ImageGeometryError, JpegDecodeError

NAMED = (ImageGeometryError, JpegDecodeError, tbl_format.DataChecksumError)
MUTATIONS = ("honest", "size_lie", "header_size", "bomb_header", "real_bomb", "flip", "flip_header", "truncate",
             "garbage", "precision", "components", "segment_length", "in_shard")
CHUNK = 50  # cases per dataset


def sof_offset(data: bytes) -> int:
    """Offset of the first SOF0/SOF2 marker's length field (the encoders used here write one of these)."""
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        k = data.find(marker)
        if k >= 0:
            return k + 2
    raise AssertionError("no SOF marker")


def patch(data: bytes, offset: int, values: bytes) -> bytes:
    b = bytearray(data)
    b[offset:offset + len(values)] = values
    return bytes(b)


def base_jpeg(rng: random.Random) -> tuple[bytes, int, int]:
    """A valid JPEG of a random size, greyscale or colour, baseline or progressive."""
    h, w = rng.randrange(8, 97), rng.randrange(8, 97)
    y, x = np.mgrid[0:h, 0:w]
    img = ((rng.randrange(256) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)
    img = np.repeat(img, 3, axis=2)
    pil = Image.fromarray(img)
    if rng.random() < 0.2:
        pil = pil.convert("L")
    buf = io.BytesIO()
    pil.save(buf, "JPEG", quality=rng.randrange(30, 96), progressive=rng.random() < 0.3)
    return buf.getvalue(), h, w


def bomb() -> bytes:
    """A valid 4000 x 4000 JPEG of one colour: a few kB that decode to 48 MB. Encoded in a child process, so
    the pixels it is made from never count in this process's peak RSS."""
    code = ("import sys, numpy as np, simplejpeg; sys.stdout.buffer.write(simplejpeg.encode_jpeg("
            "np.full((4000, 4000, 3), 90, np.uint8), quality=50, colorspace='RGB'))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout


def make_case(rng: random.Random, kind: str, big: bytes) -> tuple[bytes, int, int]:
    """(bytes, declared height, declared width) of one case of mutation ``kind``."""
    data, h, w = base_jpeg(rng)
    sof = sof_offset(data)
    if kind == "size_lie":
        dh, dw = rng.choice([(1, 0), (0, 1), (-1, 0), (0, -1), (h, w), (-h // 2, 0)])
        if rng.random() < 0.3 and h != w:
            return data, w, h  # transposed
        return data, max(1, h + dh), max(1, w + dw)
    if kind == "header_size":
        nh, nw = rng.randrange(1, 200), rng.randrange(1, 200)
        return patch(data, sof + 3, nh.to_bytes(2, "big") + nw.to_bytes(2, "big")), h, w
    if kind == "bomb_header":  # a small file whose header claims up to 65535 x 65535
        nh, nw = rng.randrange(8000, 65536), rng.randrange(8000, 65536)
        return patch(data, sof + 3, nh.to_bytes(2, "big") + nw.to_bytes(2, "big")), h, w
    if kind == "real_bomb":  # a real 4000 x 4000 image declared small
        return big, rng.randrange(16, 300), rng.randrange(16, 300)
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), h, w
    if kind == "flip_header":
        b = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(min(len(b), sof + 20))] = rng.randrange(256)
        return bytes(b), h, w
    if kind == "truncate":
        return data[: rng.randrange(0, len(data))], h, w
    if kind == "garbage":
        head = b"\xff\xd8" if rng.random() < 0.5 else b""
        return head + rng.randbytes(rng.randrange(0, 3000)), h, w
    if kind == "precision":
        return patch(data, sof + 2, bytes([rng.choice([12, 16, 0, 255])])), h, w
    if kind == "components":
        return patch(data, sof + 7, bytes([rng.choice([0, 2, 4, 255])])), h, w
    if kind == "segment_length":  # the first segment after SOI gets a random length
        return patch(data, 4, rng.randrange(0, 65536).to_bytes(2, "big")), h, w
    return data, h, w  # honest, and in_shard (its bytes are flipped in the written file)


def true_sizes(data: bytes) -> set[tuple[int, int]]:
    """The sizes two other readers see in ``data`` (Pillow's and simplejpeg's header readers); empty if neither."""
    sizes = set()
    try:
        with Image.open(io.BytesIO(data)) as im:
            sizes.add((im.size[1], im.size[0]))
    except Exception:
        pass
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        sizes.add((h, w))
    except Exception:
        pass
    return sizes


def write(path: Path, rows: list[tuple[bytes, int, int]]) -> Path:
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    with tbl_format.Writer(path, schema) as w:
        for i, (b, h, wd) in enumerate(rows):
            w.write({"image": b, "height": h, "width": wd, "label": i})
    return path


def flip_in_file(path: Path, blob: bytes, rng: random.Random) -> bytes:
    """Flip one bit of ``blob`` where the written shard holds it (after its checksums were written); the
    row's bytes as they now are."""
    raw = bytearray(path.read_bytes())
    at = raw.find(blob)
    assert at >= 0 and len(blob) > 8
    raw[at + rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(raw))
    return bytes(raw[at:at + len(blob)])


def serve(path: Path, row: int, verify: str) -> None:
    crop = RandomResizedCrop(4, scale=(0.05, 1.0))  # DCT scales 1/8 to 1 all occur
    with ImageLoader(path, 1, rows=[row], shuffle=False, random_resized_crop=crop, backend="numpy",
                     num_threads=1, verify=verify, prefetch=1) as ld:
        for _ in ld:
            pass


def main(cases: int, seed: int, verify: str) -> dict:
    rng = random.Random(seed)
    big = bomb()
    outcomes: Counter = Counter()
    crashes, mismatches, honest_refused = [], [], []
    baseline = None
    largest_declared = largest_bomb = 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = [rng.choice(MUTATIONS) for _ in range(cases)]
        plan[0] = "honest"  # the baseline RSS is taken once one row was served
        for start in range(0, cases, CHUNK):
            kinds = plan[start:start + CHUNK]
            rows = [make_case(rng, kind, big) for kind in kinds]
            # an in_shard case sits alone in its own one-row dataset: the flipped block is its own
            shared = write(Path(tmp) / f"d{start}.tbl", rows)
            for k, (kind, (data, h, w)) in enumerate(zip(kinds, rows, strict=True)):
                largest_declared = max(largest_declared, h * w * 3)
                header = true_sizes(data)
                largest_bomb = max([largest_bomb, *(a * b * 3 for a, b in header)])
                path, row = shared, k
                if kind == "in_shard":
                    path, row = write(Path(tmp) / f"s{start + k}.tbl", [(data, h, w)]), 0
                    header = true_sizes(flip_in_file(path, data, rng))
                try:
                    serve(path, row, verify)
                    outcome = "served"
                    if header != {(h, w)}:
                        mismatches.append({"case": start + k, "kind": kind, "declared": [h, w],
                                           "header": sorted(header)})
                except NAMED as e:
                    outcome = type(e).__name__
                    if kind == "honest":
                        honest_refused.append({"case": start + k, "error": repr(e)})
                except Exception as e:  # anything unnamed is a crash of the fuzz
                    outcome = "crash"
                    crashes.append({"case": start + k, "kind": kind, "error": repr(e)})
                outcomes[f"{kind}:{outcome}"] += 1
                if baseline is None and outcome == "served":
                    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"cases": cases, "verify": verify, "crashes": crashes, "mismatches": mismatches,
            "honest_refused": honest_refused, "outcomes": dict(sorted(outcomes.items())),
            "baseline_rss": baseline, "peak_rss": peak, "largest_declared": largest_declared,
            "largest_bomb": largest_bomb}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])))
