"""Device check of TBL's GPU paths: the CUDA tests, then each measurement next to its same-run ceiling.

Run from the repository root (``scripts/gpu_check.sh`` sets up the import path and builds tbl-kernels):

    python packages/tbl-resident/scripts/gpu_check.py --out gpu_check.json          # CUDA, full sizes
    python packages/tbl-resident/scripts/gpu_check.py --device cpu --quick          # tiny, anywhere

Phases (``--phases``, comma-separated; all by default), each configuration in its own subprocess:

- ``tests``: pytest of tbl-resident's tests and of tbl-loader's device tests (the CUDA
  ones skip without CUDA); their summary lines.
- ``resident``: ``ResidentImageLoader`` images/s (shuffled, ``--batch`` images) at each
  ``--sizes`` px, float16 / bfloat16 / float32, plain / flip / flip + RandomResizedCrop;
  ceiling: a device-to-device copy of the same output bytes per batch, same process.
- ``upload``: the loader's upload of a ``--upload-gb`` dataset against pinned
  host-to-device bandwidth measured in the same process.
- ``host``: ``ImageLoader(device=..., pin_memory=True, dtype="uint8")`` with flips, normalize as a
  ``device_transform``, ``--threads`` threads, at 224 px; ceiling: pinned host-to-device
  bandwidth over the same bytes. Beside it, a PyTorch DataLoader with ``--threads`` workers
  decoding the same photos' JPEG files with torchvision (RandomResizedCrop + flip).
- ``jpeg``: JPEG storage (``tbl convert --max-size 256 --store jpeg`` of real photos) served
  with RandomResizedCrop 224 + flip in float16: the CPU decode over ``--threads`` threads
  against ``decode_device="cuda"`` (nvJPEG); and the two decoders' pixels compared (uint8,
  same boxes and flips).
- ``train``: a ResNet-50 training loop (torchvision, channels_last, bf16 autocast, SGD) fed by
  synthetic batches (the ceiling), the resident loader, the host loader, the GPU-decode loader
  and the DataLoader: images/s, and the fraction of wall time spent waiting in ``next()``.

The photos come from ``--jpeg-store`` (a JPEG store made here with ``python -m
tbl_bench.sample`` and ``tbl convert --max-size 256 --store jpeg``), or are synthesized
(smooth images, for ``--quick``). Goals are judged on CUDA at full size only. Prints a table
and writes the results as JSON to ``--out`` after every phase.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

GOAL_IMAGES_PER_S = 1_000_000
GOAL_COPY_RATIO = 0.5
GOAL_UPLOAD_RATIO = 2.0
GOAL_HOST_IMAGES_PER_S = 150_000
GOAL_NVJPEG_SPEEDUP = 3.0
GOAL_DATA_WAIT = 0.02
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_ROOT.parents[1]
SCRIPT = Path(__file__).resolve()
PHASES = ("tests", "resident", "upload", "host", "jpeg", "train")
DTYPES = ("float16", "bfloat16", "float32")
AUGMENTS = ("plain", "flip", "flip+crop")
QUICK_RESIDENT = (("float16", "plain"), ("float32", "plain"), ("float16", "flip+crop"))
LOADER_TESTS = ("test_gpu_decode.py", "test_cuda_paths.py", "test_image_loader.py", "test_output.py", "test_ring.py",
                "test_transforms.py")


def _log(msg: str) -> None:
    print(msg, flush=True)


# ---- data --------------------------------------------------------------------------------------


def _write_part(args: tuple[str, int, int, int, int]) -> str:
    """Write rows [lo, hi) as one part file; images repeat a per-part random block (content is irrelevant
    to throughput, and generating gigabytes of random bytes would dominate the check)."""
    import tbl_format

    path, lo, hi, size, seed = args
    block = np.random.default_rng(seed).integers(0, 256, (min(512, hi - lo), size, size, 3), dtype=np.uint8)

    def samples():
        for i in range(lo, hi):
            yield {"image": block[(i - lo) % len(block)], "label": np.int64(i % 1000)}

    tbl_format.write(samples(), path, metadata={"source": "tbl-resident gpu_check"})
    return path


def make_dataset(root: Path, count: int, size: int, workers: int) -> Path:
    import tbl_format

    parts_dir = root / "parts"
    parts_dir.mkdir(parents=True)
    nparts = max(1, min(workers, count // 256 or 1))
    bounds = np.linspace(0, count, nparts + 1).astype(int)
    jobs = [(str(parts_dir / f"part{k:03d}.tbl"), int(bounds[k]), int(bounds[k + 1]), size, k)
            for k in range(nparts)]
    if nparts == 1:
        parts = [_write_part(jobs[0])]
    else:
        # spawn: the parent may already hold CUDA and torch's threads, which a forked child must not inherit.
        with ProcessPoolExecutor(nparts, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_write_part, jobs))
    return tbl_format.merge_manifests(parts, root / "dataset")


def synthetic_jpeg_store(path: Path, count: int) -> Path:
    """A small JPEG store of smooth synthetic images (for --quick when no photo store is given)."""
    import simplejpeg

    import tbl_format

    rng = np.random.default_rng(0)
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    with tbl_format.Writer(path, schema) as w:
        for i in range(count):
            h, wd = (int(v) for v in rng.integers(40, 97, size=2))
            y, x = np.mgrid[0:h, 0:wd]
            img = ((rng.integers(0, 256, 3) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorspace="RGB"),
                     "height": h, "width": wd, "label": i % 10})
    return path


def repeat_store(src: Path, dst: Path, rows: int) -> Path:
    """``rows`` rows cycling through the rows of dataset ``src`` (same schema and metadata)."""
    import tbl_format

    with tbl_format.open(src) as ds:
        n = len(ds)
        keys = list(ds.schema.leaves)
        columns = {k: ds.values(k, list(range(n))) for k in keys}
        schema, metadata = ds.schema, dict(ds.metadata)

        def samples():
            for i in range(rows):
                yield {k: columns[k][i % n] for k in keys}

        return tbl_format.write(samples(), dst, schema=schema, metadata=metadata)


def export_jpeg_files(store: Path, folder: Path) -> tuple[list[str], list[int]]:
    """The store's JPEG rows as files ``folder/c<label>/<row>.jpg`` (what a DataLoader pipeline reads)."""
    import tbl_format

    files, labels = [], []
    with tbl_format.open(store) as ds:
        rows = list(range(len(ds)))
        for i, (blob, label) in enumerate(zip(ds.values("image", rows), ds.values("label", rows), strict=True)):
            d = folder / f"c{int(label):03d}"
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"{i:06d}.jpg"
            p.write_bytes(bytes(blob))
            files.append(str(p))
            labels.append(int(label))
    return files, labels


def pick_tmp(needed: int) -> str:
    """/dev/shm when it holds the data twice over (no disk in the way), else the system temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > 2 * needed:
        return shm
    return tempfile.gettempdir()


# ---- device helpers ----------------------------------------------------------------------------


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def h2d_bandwidth(device, nbytes: int, reps: int = 5) -> float:
    """Best-of-``reps`` GB/s of one copy of ``nbytes`` from (pinned, on CUDA) host memory to ``device``."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = math.inf
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def copy_floor(device, batches: int, batch_bytes: int, images_per_batch: int, reps: int) -> dict:
    """Images/s of copying each batch's output bytes device-to-device (from a buffer larger than the cache)."""
    import torch

    pool = max(4 * batch_bytes, 1 << 30) if device.type == "cuda" else 4 * batch_bytes
    src = torch.ones(pool, dtype=torch.uint8, device=device)
    dst = torch.empty(batch_bytes, dtype=torch.uint8, device=device)
    slots = pool // batch_bytes
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        for k in range(batches):
            off = (k % slots) * batch_bytes
            dst.copy_(src[off : off + batch_bytes])
        sync(device)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"images_per_s": batches * images_per_batch / t, "gb_per_s": batches * batch_bytes / t / 1e9,
            "note": "read + write of the output bytes; GB/s counts the bytes written once"}


def serve_rate(loader, device, warmup: int, epochs: int) -> dict:
    """Median images/s over ``epochs`` timed epochs (after ``warmup``), synchronized at each epoch's end."""
    rates = []
    for epoch in range(warmup + epochs):
        loader.set_epoch(epoch)
        sync(device)
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            n += batch.images.shape[0]
        sync(device)
        dt = time.perf_counter() - t0
        if epoch >= warmup:
            rates.append(n / dt)
    return {"images_per_s": statistics.median(rates), "epochs": [round(r) for r in rates]}


def batches_rate(iterable, device, warmup: int, batches: int) -> dict:
    """images/s of ``batches`` batches of ``iterable`` after ``warmup`` batches, synchronized at both ends."""
    it = iter(iterable)
    for _ in range(warmup):
        next(it)
    sync(device)
    t0 = time.perf_counter()
    n = 0
    for batch in itertools.islice(it, batches):
        images = batch[0] if isinstance(batch, (list, tuple)) else batch.images
        n += images.shape[0]
    sync(device)
    dt = time.perf_counter() - t0
    return {"images_per_s": n / dt, "images": n, "seconds": dt}


def normalizer(device):
    """The device transform: uint8 CHW batches to float32 normalized by ImageNet's mean and std."""
    import torch

    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def normalize(batch):
        images = batch.images if hasattr(batch, "images") else batch[0]
        out = (images.float() - mean) / std
        return batch._replace(images=out) if hasattr(batch, "_replace") else (out, *batch[1:])

    return normalize


# ---- children: one configuration each -------------------------------------------------------------


def _device(spec):
    import torch

    from tbl_resident.device import resolve_device

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    return resolve_device(spec["device"])


def child_resident(spec: dict) -> dict:
    import torch

    from tbl_loader import RandomResizedCrop
    from tbl_resident import ResidentImageLoader

    device = _device(spec)
    size, batch, dtype, aug = spec["size"], spec["batch"], spec["dtype"], spec["aug"]
    kwargs = {"dtype": dtype, "hflip": 0.0 if aug == "plain" else 0.5}
    if aug == "flip+crop":
        kwargs["random_resized_crop"] = RandomResizedCrop(size)
    with ResidentImageLoader(spec["path"], batch, device=device, shuffle=True, seed=0, progress=False,
                             **kwargs) as loader:
        count = loader.cursor.num_samples
        rate = serve_rate(loader, device, spec["warmup"], spec["epochs"])
    item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    batch_bytes = batch * 3 * size * size * item
    floor = copy_floor(device, -(-count // batch), batch_bytes, batch, reps=3)
    rate["d2d_copy_same_bytes"] = floor
    rate["ratio_to_copy"] = rate["images_per_s"] / floor["images_per_s"]
    return rate


def child_upload(spec: dict) -> dict:
    from tbl_resident import ResidentImageLoader

    device = _device(spec)
    h2d = h2d_bandwidth(device, min(spec["bytes"], 1 << 30))
    with ResidentImageLoader(spec["path"], 256, device=device, progress=False, dtype="uint8") as loader:
        st = loader.upload_stats
    ideal = st.bytes / (h2d * 1e9)
    return {"bytes": st.bytes, "seconds": st.seconds, "host_copy_seconds": st.host_seconds, "gb_per_s": st.gb_per_s,
            "chunks": st.chunks, "pinned": st.pinned, "h2d_gb_per_s": h2d, "ratio_to_h2d": st.seconds / ideal}


def child_host(spec: dict) -> dict:
    from tbl_loader import ImageLoader

    device = _device(spec)
    pin = device.type == "cuda"
    with ImageLoader(spec["path"], spec["batch"], device=None if device.type == "cpu" else device,
                     pin_memory=pin, dtype="uint8", hflip=0.5, num_threads=spec["threads"], seed=0,
                     device_transform=normalizer(device), backend="torch") as loader:
        shape = loader.image_shape
        rate = serve_rate(loader, device, spec["warmup"], spec["epochs"])
    per_image = int(np.prod(shape))
    h2d = h2d_bandwidth(device, min(256 * per_image * 8, 1 << 30))
    rate["pinned_h2d_gb_per_s"] = h2d
    rate["h2d_images_per_s"] = h2d * 1e9 / per_image
    rate["ratio_to_h2d"] = rate["images_per_s"] / rate["h2d_images_per_s"]
    return rate


class _JpegFiles:
    """A map-style dataset of JPEG files, decoded and augmented by torchvision (the usual PyTorch pipeline)."""

    def __init__(self, files, labels, size: int, length: int) -> None:
        from torchvision.transforms import v2

        self.files, self.labels, self.length = files, labels, length
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        i %= len(self.files)  # the photos, repeated
        with open(self.files[i], "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return self.transform(decode_jpeg(data, mode=ImageReadMode.RGB)), self.labels[i]


def _dataloader(spec: dict, device):
    import torch

    files = json.loads(Path(spec["files"]).read_text())
    ds = _JpegFiles(files["files"], files["labels"], spec["size"], spec["rows"])
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(ds, spec["batch"], shuffle=True, num_workers=spec["threads"],
                                       pin_memory=device.type == "cuda", drop_last=True, generator=g,
                                       persistent_workers=False, prefetch_factor=4 if spec["threads"] else None)


def _on_device(batches, device, transform):
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        yield transform((images, labels.to(device, non_blocking=True)))


def child_dataloader(spec: dict) -> dict:
    device = _device(spec)
    loader = _dataloader(spec, device)
    return batches_rate(_on_device(loader, device, normalizer(device)), device, spec["warmup"], spec["batches"])


def child_jpeg(spec: dict) -> dict:
    from tbl_loader import ImageLoader, RandomResizedCrop

    device = _device(spec)
    kw = dict(random_resized_crop=RandomResizedCrop(spec["size"]), hflip=0.5, seed=0, backend="torch",
              num_threads=spec["threads"], device=None if device.type == "cpu" else device)
    gpu = spec["decode"] == "cuda"
    if gpu:
        kw["decode_device"] = device
    else:
        kw["pin_memory"] = device.type == "cuda"
    with ImageLoader(spec["path"], spec["batch"], dtype="float16", **kw) as loader:
        out = batches_rate(loader, device, spec["warmup"], spec["batches"])
    if gpu:
        from tbl_loader.image.gpu_decode import NvJpegDecoder

        out["decoder"] = NvJpegDecoder(device).info
    if gpu and spec.get("compare_batches"):
        out["against_cpu_decode"] = _compare_decoders(spec, device, kw)
    if gpu:
        out["parts"] = _gpu_decode_parts(spec, device)
    return out


def _gpu_decode_parts(spec: dict, device, batches: int = 10) -> dict:
    """images/s of nvJPEG's batch decode alone, and of the device resampling alone, on the store's rows."""
    import torch

    import tbl_format
    from tbl_loader.image.gpu_decode import NvJpegDecoder, resample_batch
    from tbl_loader.stream import order

    dec, b = NvJpegDecoder(device), spec["batch"]
    with tbl_format.open(spec["path"]) as ds:
        rows = list(range(b * batches))
        blobs = [torch.frombuffer(bytearray(v), dtype=torch.uint8) for v in ds.values("image", rows)]
        hs, ws = (np.asarray(ds.values(k, rows), np.int64) for k in ("height", "width"))
    dec.decode(blobs[:b])
    sync(device)
    t0 = time.perf_counter()
    for k in range(batches):
        images = dec.decode(blobs[k * b : (k + 1) * b])
    sync(device)
    decode_rate = b * batches / (time.perf_counter() - t0)
    ids = np.arange(b, dtype=np.int64)
    boxes = order.random_resized_crop_boxes(0, 0, ids, hs[-b:], ws[-b:], (0.08, 1.0), (3 / 4, 4 / 3))
    flip = np.arange(b) % 2 == 0
    size = (spec["size"], spec["size"])
    resample_batch(images, boxes, size, flip=flip)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(batches):
        resample_batch(images, boxes, size, flip=flip)
    sync(device)
    return {"decode_images_per_s": decode_rate,
            "resample_images_per_s": b * batches / (time.perf_counter() - t0)}


def _compare_decoders(spec: dict, device, kw: dict) -> dict:
    """uint8 pixels of the GPU decode against the CPU decode: same boxes, same flips."""
    from tbl_loader import ImageLoader

    cpu_kw = {k: v for k, v in kw.items() if k != "decode_device"}
    cpu_kw["device"] = None
    diffs = []
    with ImageLoader(spec["path"], spec["batch"], dtype="uint8", shuffle=False, **kw) as g, \
            ImageLoader(spec["path"], spec["batch"], dtype="uint8", shuffle=False, **cpu_kw) as c:
        for bg, bc in itertools.islice(zip(g, c, strict=False), spec["compare_batches"]):
            assert np.array_equal(bg.indices.numpy(), bc.indices.numpy())
            diffs.append((bg.images.cpu().numpy().astype(np.int16) - bc.images.numpy().astype(np.int16)).ravel())
    d = np.abs(np.concatenate(diffs))
    return {"values": int(d.size), "mean_abs": float(d.mean()), "max_abs": int(d.max()),
            "p99_abs": float(np.percentile(d, 99)), "p999_abs": float(np.percentile(d, 99.9)),
            "fraction_equal": float((d == 0).mean()), "fraction_within_2": float((d <= 2).mean())}


def _feed(spec: dict, device):
    """(iterator of (images, labels) on the device, close) for the training loop's feed."""
    import torch

    from tbl_loader import ImageLoader, RandomResizedCrop

    feed, size, batch = spec["feed"], spec["size"], spec["batch"]
    crop = RandomResizedCrop(size)
    norm = normalizer(device)
    if feed == "synthetic":
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        return itertools.repeat((x, y)), lambda: None
    if feed == "resident":
        from tbl_resident import ResidentImageLoader

        ld = ResidentImageLoader(spec["path"], batch, device=device, random_resized_crop=crop, hflip=0.5,
                                 dtype="bfloat16", channels_last=True, progress=False, drop_last=True)
    elif feed == "host":
        ld = ImageLoader(spec["path"], batch, device=device, pin_memory=True, dtype="uint8", hflip=0.5,
                         random_resized_crop=crop, num_threads=spec["threads"], device_transform=norm,
                         drop_last=True)
    elif feed == "nvjpeg":
        ld = ImageLoader(spec["path"], batch, device=device, decode_device=device, dtype="bfloat16", hflip=0.5,
                         random_resized_crop=crop, drop_last=True)
    elif feed == "cpu-jpeg":
        ld = ImageLoader(spec["path"], batch, device=device, pin_memory=True, dtype="bfloat16", hflip=0.5,
                         random_resized_crop=crop, num_threads=spec["threads"], drop_last=True)
    elif feed == "dataloader":
        dl = _dataloader(spec, device)

        def epochs():
            while True:
                yield from _on_device(dl, device, norm)

        return epochs(), lambda: None
    else:
        raise ValueError(feed)

    def epochs():
        for epoch in itertools.count():
            ld.set_epoch(epoch)
            for b in ld:
                yield b.images, b.labels

    return epochs(), ld.close


def child_train(spec: dict) -> dict:
    import torch
    import torchvision

    device = _device(spec)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches, close = _feed(spec, device)
    amp = device.type == "cuda"

    def step(x, y):
        x = x.contiguous(memory_format=torch.channels_last)
        if not amp:
            x = x.float()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    try:
        for _ in range(spec["warmup"]):
            step(*next(batches))
        sync(device)
        wait = 0.0
        t0 = time.perf_counter()
        for _ in range(spec["steps"]):
            w0 = time.perf_counter()
            x, y = next(batches)
            wait += time.perf_counter() - w0
            step(x, y)
        sync(device)
        dt = time.perf_counter() - t0
    finally:
        close()
    images = spec["steps"] * spec["batch"]
    return {"images_per_s": images / dt, "steps": spec["steps"], "seconds": dt, "wait_seconds": wait,
            "data_wait_fraction": wait / dt}


CHILDREN = {"resident": child_resident, "upload": child_upload, "host": child_host, "dataloader": child_dataloader,
            "jpeg": child_jpeg, "train": child_train}


def run_child(kind: str, spec: dict, timeout: float) -> dict:
    """One configuration in its own interpreter; its result dict, or {"error": ...}."""
    cmd = [sys.executable, str(SCRIPT), "--child", kind, "--spec", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout[-1500:] + proc.stderr[-3000:]).strip()
        _log(f"  {kind} failed (exit {proc.returncode}):\n{tail}")
        return {"error": tail[-2000:] or f"exit {proc.returncode}"}
    out = json.loads(lines[-1][len("RESULT "):])
    out["child_seconds"] = round(time.perf_counter() - t0, 2)
    return out


# ---- phases ------------------------------------------------------------------------------------


def _summary(text: str) -> dict:
    import re

    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "error")}
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    last = lines[-1].strip() if lines else ""
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors|error)", last):
        counts[what] += int(n)
    counts["errors"] += counts.pop("error")
    return {"summary": last, **counts}


def run_tests(device: str, timeout: float, which: list[str]) -> dict:
    out = {}
    xdist = [] if device == "cpu" else ["-n", "8"]
    suites = {  # name: (paths, extra pytest arguments)
        "tbl-resident": ([str(PACKAGE_ROOT / "tests")], []),
        "tbl-resident-cuda": ([str(PACKAGE_ROOT / "tests")], ["-k", "cuda"]),  # the device tests only
        "tbl-loader": ([str(REPO_ROOT / "packages" / "tbl-loader" / "tests" / f) for f in LOADER_TESTS], []),
    }
    for name, (paths, extra) in suites.items():
        if name.removeprefix("tbl-") not in which:
            continue
        paths = [p for p in paths if Path(p).exists()]
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *xdist, *extra, *paths]
        _log(f"$ {' '.join(cmd)}")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(paths[0]).parent, timeout=timeout)
            text, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = str(e.stdout or "") + "\ntimed out", -1
        if rc not in (0, 5):
            _log(text[-8000:])
        res = {"returncode": rc, "seconds": round(time.perf_counter() - t0, 1), **_summary(text)}
        _log(f"tests {name}: {res['summary']} (exit {rc})")
        out[name] = res
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda (default when available), mps or cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, any device)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument("--sizes", default=None, help="resident image sides in px (default 160,224; quick 32)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256; quick 64)")
    p.add_argument("--dataset-gb", type=float, default=None, help="each resident dataset (default 1.0)")
    p.add_argument("--upload-gb", type=float, default=None, help="the upload dataset (default 3.0)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per configuration (default 4)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="CPU threads / DataLoader workers (default 16)")
    p.add_argument("--jpeg-store", default=None, help="JPEG store of real photos (tbl convert --store jpeg)")
    p.add_argument("--train-steps", type=int, default=None, help="timed ResNet-50 steps per feed (default 30)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing the datasets")
    p.add_argument("--tmp", default=None, help="folder for the temporary data")
    p.add_argument("--child-timeout", type=float, default=None, help="seconds per configuration (default 120)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--test-suites", default="resident,loader", help="test suites of the tests phase: resident, resident-cuda (-k cuda), loader")
    p.add_argument("--resident-configs", default=None,
                   help="only these resident configurations, e.g. 160:float16:flip+crop,224:float16:plain")
    p.add_argument("--train-feeds", default=None, help="only these ResNet-50 feeds (synthetic is always run)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        result = CHILDREN[args.child](json.loads(args.spec))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    import torch

    name = args.device or ("cuda" if torch.cuda.is_available() else None)
    if name is None:
        p.error("no CUDA device: pass --device cpu (or mps)")
    phases = [ph for ph in args.phases.split(",") if ph]
    unknown = set(phases) - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    if args.skip_tests and "tests" in phases:
        phases.remove("tests")
    quick = args.quick
    cuda = name.startswith("cuda")
    sizes = [int(s) for s in (args.sizes or ("32" if quick else "160,224")).split(",")]
    batch = args.batch or (64 if quick else 256)
    gb = args.dataset_gb if args.dataset_gb is not None else (0.006 if quick else 1.0)
    upload_gb = args.upload_gb if args.upload_gb is not None else (0.006 if quick else 3.0)
    epochs = args.epochs or (2 if quick else 3)
    threads = args.threads or (2 if quick else 16)
    train_steps = args.train_steps or (2 if quick else 25)
    timeout = args.child_timeout or (300 if quick else 120)
    try:
        import torchvision

        tv_version = torchvision.__version__
    except Exception as e:
        tv_version = None
        tv_error = f"{type(e).__name__}: {e}"
    results: dict = {
        "device": name,
        "device_name": torch.cuda.get_device_name() if cuda else name,
        "torch": torch.__version__, "torchvision": tv_version, "cpu_count": os.cpu_count(),
        "sizes": sizes, "batch": batch, "threads": threads, "quick": quick, "phases": phases,
    }

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))

    def common(**kw):
        return {"device": name, "threads": threads if kw.pop("threaded", False) else None, **kw}

    if "tests" in phases:
        results["tests"] = run_tests(name, 150 if not quick else 600, args.test_suites.split(","))
        save()
    data_phases = set(phases) - {"tests"}
    biggest = max([gb, upload_gb]) * 1e9 * 3
    root = Path(tempfile.mkdtemp(prefix="tbl-resident-check-", dir=args.tmp or pick_tmp(int(biggest))))
    try:
        datasets: dict = {}
        t0 = time.perf_counter()
        if "resident" in data_phases or ("train" in data_phases and tv_version is not None):
            for size in sizes:
                count = max(batch, int(gb * 1e9) // (size * size * 3))
                datasets[size] = make_dataset(root / f"res{size}", count, size, args.workers)
                results.setdefault("datasets", {})[f"resident_{size}"] = {"images": count,
                                                                           "bytes": count * size * size * 3}
        if "upload" in data_phases:
            usize = sizes[0]
            ucount = max(batch, int(upload_gb * 1e9) // (usize * usize * 3))
            datasets["upload"] = make_dataset(root / "upload", ucount, usize, args.workers)
            results.setdefault("datasets", {})["upload"] = {"images": ucount, "bytes": ucount * usize * usize * 3}
        photo_size = 32 if quick else 224
        if data_phases & {"host", "jpeg", "train"}:
            from tbl_loader import convert

            base = Path(args.jpeg_store) if args.jpeg_store else synthetic_jpeg_store(root / "synthetic_jpeg.tbl", 96)
            rows = 2 * batch * 4 if quick else 16384
            datasets["jpeg"] = repeat_store(base, root / "jpeg.tbl", rows)
            files, labels = export_jpeg_files(base, root / "files")
            (root / "files.json").write_text(json.dumps({"files": files, "labels": labels}))
            fixed = convert(str(root / "files"), root / "photos_fixed.tbl", photo_size, workers=args.workers,
                            progress=False, report=False)
            datasets["photos"] = repeat_store(root / "photos_fixed.tbl", root / "photos.tbl", rows)
            results.setdefault("datasets", {})["photos"] = {
                "unique_photos": len(files), "rows": rows, "jpeg_store_bytes": os.path.getsize(datasets["jpeg"]),
                "fixed_size": photo_size, "converted": getattr(fixed, "count", None)}
        results.setdefault("datasets", {})["write_s"] = round(time.perf_counter() - t0, 2)
        _log(f"data: {results['datasets']} under {root}")
        save()

        if "resident" in phases:
            serving = results["serving"] = {}
            combos = QUICK_RESIDENT if quick else list(itertools.product(DTYPES, AUGMENTS))
            configs = [(size, dtype, aug) for size in sizes for dtype, aug in combos]
            if args.resident_configs:
                configs = [(int(c.split(":")[0]), *c.split(":")[1:]) for c in args.resident_configs.split(",")]
            for size, dtype, aug in configs:
                label = f"{size}px/{dtype}/{aug}"
                r = run_child("resident", common(path=str(datasets[size]), size=size, batch=batch,
                                                 dtype=dtype, aug=aug, warmup=args.warmup, epochs=epochs),
                              timeout)
                serving[label] = r
                if "error" not in r:
                    _log(f"serve {label:>26}: {r['images_per_s']:>12,.0f} images/s   d2d copy of the same "
                         f"bytes {r['d2d_copy_same_bytes']['images_per_s']:>12,.0f} images/s "
                         f"({r['d2d_copy_same_bytes']['gb_per_s']:.0f} GB/s)  ratio {r['ratio_to_copy']:.2f}")
                save()
        if "upload" in phases:
            r = results["upload"] = run_child("upload", common(path=str(datasets["upload"]),
                                                               bytes=results["datasets"]["upload"]["bytes"]), timeout)
            if "error" not in r:
                _log(f"upload: {r['bytes'] / 1e9:.2f} GB in {r['seconds']:.3f} s = {r['gb_per_s']:.1f} GB/s; pinned "
                     f"H2D {r['h2d_gb_per_s']:.1f} GB/s -> {r['ratio_to_h2d']:.2f}x the H2D time (host copies "
                     f"out of the map: {r['host_copy_seconds']:.3f} s)")
            save()
        if "host" in phases:
            host = results["host"] = {}
            host["tbl_uint8_device_transform"] = r = run_child(
                "host", common(path=str(datasets["photos"]), batch=batch, warmup=args.warmup, epochs=epochs,
                               threaded=True), timeout)
            if "error" not in r:
                _log(f"host ImageLoader uint8 {photo_size}px, {threads} threads: {r['images_per_s']:,.0f} images/s; "
                     f"pinned H2D of the same bytes {r['h2d_images_per_s']:,.0f} images/s "
                     f"({r['pinned_h2d_gb_per_s']:.1f} GB/s), ratio {r['ratio_to_h2d']:.2f}")
            if tv_version is None:
                host["dataloader_torchvision"] = {"skipped": f"torchvision does not import: {tv_error}"}
            else:
                host["dataloader_torchvision"] = r = run_child(
                    "dataloader", common(files=str(root / "files.json"), rows=1 << 20, size=photo_size, batch=batch,
                                         warmup=4 if not quick else 1, batches=40 if not quick else 2,
                                         threaded=True), timeout)
                if "error" not in r:
                    _log(f"DataLoader + torchvision, {threads} workers: {r['images_per_s']:,.0f} images/s")
            save()
        if "jpeg" in phases:
            jpeg = results["jpeg"] = {}
            jspec = dict(path=str(datasets["jpeg"]), size=photo_size, batch=batch, warmup=3 if not quick else 1,
                         batches=40 if not quick else 3, threaded=True)
            jpeg["cpu_decode"] = r = run_child("jpeg", common(decode="cpu", **jspec), timeout)
            if "error" not in r:
                _log(f"JPEG store, CPU decode ({threads} threads): {r['images_per_s']:,.0f} images/s")
            if not cuda or tv_version is None:
                jpeg["nvjpeg"] = {"skipped": "needs CUDA and torchvision"}
            else:
                jpeg["nvjpeg"] = r = run_child("jpeg", common(decode="cuda", compare_batches=8, **jspec), timeout)
                if "error" not in r and "error" not in jpeg["cpu_decode"]:
                    r["speedup_vs_cpu_decode"] = r["images_per_s"] / jpeg["cpu_decode"]["images_per_s"]
                    _log(f"JPEG store, nvJPEG: {r['images_per_s']:,.0f} images/s = {r['speedup_vs_cpu_decode']:.2f}x "
                         f"the CPU decode; pixels against the CPU decode: {r.get('against_cpu_decode')}")
            save()
        if "train" in phases:
            train = results["train"] = {}
            if tv_version is None:
                train["skipped"] = f"torchvision does not import: {tv_error}"
            else:
                feeds = {"synthetic": {}, "resident": {"path": str(datasets[max(sizes)])},
                         "host": {"path": str(datasets["photos"])}, "cpu-jpeg": {"path": str(datasets["jpeg"])},
                         "dataloader": {"files": str(root / "files.json"), "rows": 1 << 20}}
                if cuda:
                    feeds["nvjpeg"] = {"path": str(datasets["jpeg"])}
                if args.train_feeds:
                    keep = {"synthetic", *args.train_feeds.split(",")}
                    feeds = {k: v for k, v in feeds.items() if k in keep}
                for feed, extra in feeds.items():
                    size = max(sizes) if feed == "resident" else photo_size
                    r = train[feed] = run_child("train", common(feed=feed, size=size, batch=batch,
                                                                warmup=6 if not quick else 1, steps=train_steps,
                                                                threaded=True, **extra), timeout)
                    if "error" not in r:
                        if feed != "synthetic" and "error" not in train["synthetic"]:
                            r["ratio_to_synthetic"] = r["images_per_s"] / train["synthetic"]["images_per_s"]
                        _log(f"ResNet-50 fed by {feed:>10}: {r['images_per_s']:>8,.0f} images/s, waiting for data "
                             f"{100 * r['data_wait_fraction']:.2f}% of the time"
                             + (f", {r['ratio_to_synthetic']:.3f} of synthetic" if "ratio_to_synthetic" in r else ""))
                    save()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    results["goals"] = goals = judge(results) if cuda and not quick else {}
    for k, v in goals.items():
        _log(f"goal {k}: {'met' if v else 'NOT met'}")
    save()
    if args.out:
        _log(f"results written to {args.out}")
    tests = results.get("tests", {})
    return 0 if all(t["returncode"] in (0, 5) for t in tests.values()) else 1


def judge(results: dict) -> dict:
    goals = {}

    def get(*keys):
        node = results
        for k in keys:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        return node if node != {} else None

    fp16 = get("serving", "160px/float16/plain")
    if fp16 and "images_per_s" in fp16:
        goals["resident_float16_160px>=1e6_images/s"] = fp16["images_per_s"] >= GOAL_IMAGES_PER_S
        goals["resident_float16_160px>=50%_of_d2d_copy"] = fp16["ratio_to_copy"] >= GOAL_COPY_RATIO
    up = get("upload")
    if up and "ratio_to_h2d" in up:
        goals["upload<=2x_pinned_h2d"] = up["ratio_to_h2d"] <= GOAL_UPLOAD_RATIO
    host = get("host", "tbl_uint8_device_transform")
    if host and "images_per_s" in host:
        goals["host_uint8_224px>=150k_images/s"] = host["images_per_s"] >= GOAL_HOST_IMAGES_PER_S
    nv = get("jpeg", "nvjpeg")
    if nv and "speedup_vs_cpu_decode" in nv:
        goals["nvjpeg>=3x_cpu_decode"] = nv["speedup_vs_cpu_decode"] >= GOAL_NVJPEG_SPEEDUP
    for feed in ("resident", "host", "nvjpeg"):
        r = get("train", feed)
        if r and "data_wait_fraction" in r:
            goals[f"resnet50_{feed}_data_wait<=2%"] = r["data_wait_fraction"] <= GOAL_DATA_WAIT
    return goals


if __name__ == "__main__":
    sys.exit(main())
