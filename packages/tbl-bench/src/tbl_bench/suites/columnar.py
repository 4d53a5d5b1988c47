"""Generic samples read and written as columns: TBL's Arrow batches and get_batch against Lance, HF datasets
and litdata.

Workload: 1,000,000 rows (the sizes' ``array_rows``; 20,000 in a quick run) of ``{"x": (64,) float32,
"text": 10-200 chars, "id": int, "tags": 0-8 ints}`` (seeded), one .tbl file
and one dataset of each peer holding the same rows. Configurations (``op``):

=====================  ====================================================================
tbl-arrow/scan         ``PyTreeDataset.get_batch(range(a, a + 1024), format="arrow")`` over every row
tbl-pytree/scan        ``get_batch(range(a, a + 1024))``: the collated pytree (str as a list)
lance/scan             baseline: ``lance.dataset(path).to_batches(batch_size=1024)``
tbl-arrow/take         1,024 random rows a batch (an epoch covers every row once), Arrow
tbl-pytree/take        the same batches through ``get_batch``
lance/take             baseline: the same batches through ``LanceDataset.take``
tbl/write              ``tbl_format.write(rows, path)`` of every row (rows already in memory)
tbl-lz4/write          the same with ``compression="lz4"`` (the text and tags heaps)
tbl-zstd/write         the same with ``compression="zstd"`` (level 3)
tbl-lz4-arrow/scan     ``tbl-arrow/scan`` of a ``compression="lz4"`` file of the same rows
tbl-lz4-pytree/scan    ``tbl-pytree/scan`` of it
tbl-zstd-arrow/scan    ``tbl-arrow/scan`` of a ``compression="zstd"`` file of the same rows
tbl-zstd-pytree/scan   ``tbl-pytree/scan`` of it
lance/write            baseline: ``lance.write_dataset(pa.Table.from_pylist(rows))`` of the same rows
tbl/item               random access: ``ds[i]`` for 20,000 random rows an epoch (the row as a pytree)
lance/item             ``LanceDataset.take([i])`` for the same rows
hf/scan                HF ``datasets``: ``Dataset.iter(batch_size=1024)`` in Arrow format
hf/take                ``Dataset[batch]`` of the same random batches, Arrow format
hf/item                ``Dataset[i]`` for the same random rows (a dict)
hf/write               ``Dataset.from_list(rows, features=...).save_to_disk(dst)``
litdata/scan           litdata ``StreamingDataset``, iterated (a row at a time: it has no batch read)
litdata/item           ``StreamingDataset[i]`` for the first 2,000 of the same random rows (it is slow)
litdata/write          ``litdata.optimize`` of the first 100,000 rows (1 worker, 64 MB chunks; it writes
                       about 3,000 rows/s here), one timed epoch: its rows/s, not its size, compares
=====================  ====================================================================

Reads are the *produce* level (batches are made and dropped). Writes time one
dataset written per epoch into a fresh directory, and record its size on disk
(``info["bytes"]``) and peak RSS. The peers run with ``--peers``, in the peer interpreter (pylance, datasets
and litdata are in the `peers` extra). The module imports only the standard library and numpy at top level.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "columnar"
TITLE = "Column scans, random batches and writes of generic samples"
UNIT = "rows/s"
COMPARE_ON = ("op",)

QUICK_ROWS = 20_000
BATCH = 1024
READ_OPS = ("scan", "take")
ITEM_ROWS = 20_000  # random single-row reads an epoch
LITDATA_ITEM_ROWS = 2_000  # litdata's single-row reads are slow: a fixed prefix of the same rows
LITDATA_WRITE_ROWS = 100_000  # and its writes: a million rows would take minutes an epoch
#: Codecs of the compressed configurations (variable-size leaves only: x and id stay raw columns).
CODECS = ("lz4", "zstd")


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """The rows, in memory: x (64,) float32, text of 10-200 lowercase letters and spaces, id, tags of 0-8 ints."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 64)).astype(np.float32)
    lengths = rng.integers(10, 201, n)
    tag_counts = rng.integers(0, 9, n)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8)
    text = bytes(letters[rng.integers(0, letters.shape[0], int(lengths.sum()))]).decode()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [{"x": x[i], "text": text[starts[i] : ends[i]], "id": i, "tags": list(range(int(tag_counts[i])))}
            for i in range(n)]


def write_tbl(dst: str, rows: int, compression: str | None = None) -> None:
    from tbl_format import write

    write(make_rows(rows), dst, variable=["tags"], compression=compression)


def _arrow_table(rows: list[dict]):
    import pyarrow as pa

    schema = pa.schema([("x", pa.list_(pa.float32(), 64)), ("text", pa.large_string()), ("id", pa.int64()),
                        ("tags", pa.large_list(pa.int64()))])
    return pa.Table.from_pylist(rows, schema=schema)


def write_lance(dst: str, rows: int) -> None:
    """Peer preparation: the same rows as a Lance dataset."""
    import lance

    lance.write_dataset(_arrow_table(make_rows(rows)), dst)


def _hf_features():
    import datasets

    return datasets.Features({"x": datasets.Sequence(datasets.Value("float32"), length=64),
                              "text": datasets.Value("large_string"), "id": datasets.Value("int64"),
                              "tags": datasets.LargeList(datasets.Value("int64"))})


def _write_hf(rows: list[dict], dst: str) -> None:
    import datasets

    datasets.Dataset.from_list(rows, features=_hf_features()).save_to_disk(dst)


def write_hf(dst: str, rows: int) -> None:
    """Peer preparation: the same rows as a HF ``datasets`` folder (``save_to_disk``)."""
    _write_hf(make_rows(rows), dst)


def _identity(row: dict) -> dict:
    return row


def _write_litdata(rows: list[dict], dst: str) -> None:
    import litdata

    litdata.optimize(fn=_identity, inputs=rows, output_dir=str(dst), chunk_bytes="64MB", num_workers=1,
                     verbose=False, mode="overwrite")


def write_litdata(dst: str, rows: int) -> None:
    """Peer preparation: the same rows through ``litdata.optimize``."""
    _write_litdata(make_rows(rows), dst)


def _dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class _Reads:
    """One epoch: every row, in 1,024-row batches, in file order (scan) or in random batches (take), or
    ``item_rows`` random rows one at a time (item). The random rows are drawn untimed, the same for every reader."""

    def __init__(self, read, rows: int, op: str, item_rows: int = ITEM_ROWS):
        self.read, self.rows, self.op = read, rows, op
        self.item_rows = min(item_rows, rows)
        self.items_per_epoch = self.item_rows if op == "item" else rows
        self.batches: list = []
        self.info: dict = {}

    def prepare_epoch(self, epoch: int) -> None:
        perm = np.random.default_rng(epoch).permutation(self.rows)
        if self.op == "take":
            self.batches = [np.sort(perm[a : a + BATCH]) for a in range(0, self.rows, BATCH)]
        elif self.op == "item":
            self.batches = perm[: self.item_rows].tolist()

    def run_epoch(self, epoch: int) -> int:
        return self.read(self.batches)

    def close(self) -> None:
        self.read = None


def tbl_reads(path: str, op: str, fmt: str, rows: int):
    """Workload factory: PyTreeDataset(path).get_batch in 1,024-row batches, ``fmt`` "arrow" or "pytree"."""
    from tbl_loader import PyTreeDataset

    if op not in (*READ_OPS, "item") or fmt not in ("arrow", "pytree"):
        raise ValueError(f"op must be one of {READ_OPS} or item and fmt arrow or pytree, got {op!r}, {fmt!r}")
    ds = PyTreeDataset(path)
    get_batch = ds.get_batch

    def read(batches) -> int:
        n = 0
        if op == "item":
            for i in batches:
                ds[i]
            return len(batches)
        if op == "scan":
            for a in range(0, rows, BATCH):
                b = get_batch(range(a, min(a + BATCH, rows)), format=fmt)
                n += b.num_rows if fmt == "arrow" else len(b["id"])
            return n
        for idx in batches:
            b = get_batch(idx, format=fmt)
            n += b.num_rows if fmt == "arrow" else len(b["id"])
        return n

    return _Reads(read, rows, op)


def lance_reads(path: str, op: str, rows: int):
    """Workload factory: a Lance dataset, scanned with to_batches(1024) or read with take(batch)."""
    import lance

    if op not in (*READ_OPS, "item"):
        raise ValueError(f"op must be one of {READ_OPS} or item, got {op!r}")
    ds = lance.dataset(path)

    def read(batches) -> int:
        n = 0
        if op == "item":
            for i in batches:
                ds.take([i])
            return len(batches)
        if op == "scan":
            for b in ds.to_batches(batch_size=BATCH):
                n += b.num_rows
            return n
        for idx in batches:
            n += ds.take(idx).num_rows
        return n

    reads = _Reads(read, rows, op)
    reads.info["lance"] = lance.__version__
    return reads


def hf_reads(path: str, op: str, rows: int):
    """Workload factory: a HF ``datasets`` folder (``load_from_disk``) in Arrow format, scanned with
    ``iter(batch_size=1024)``, read in random batches, or row by row (``ds[i]``, a dict)."""
    import datasets

    if op not in (*READ_OPS, "item"):
        raise ValueError(f"op must be one of {READ_OPS} or item, got {op!r}")
    plain = datasets.load_from_disk(path)
    ds = plain.with_format("arrow")

    def read(batches) -> int:
        n = 0
        if op == "item":
            for i in batches:
                plain[i]
            return len(batches)
        if op == "scan":
            for b in ds.iter(batch_size=BATCH):
                n += b.num_rows
            return n
        for idx in batches:
            n += ds[idx].num_rows
        return n

    reads = _Reads(read, rows, op)
    reads.info["datasets"] = datasets.__version__
    return reads


def litdata_reads(path: str, op: str, rows: int):
    """Workload factory: litdata ``StreamingDataset``, iterated row by row (scan) or read at random rows (item)."""
    import litdata

    if op not in ("scan", "item"):
        raise ValueError(f"op must be scan or item for litdata (it has no batch read), got {op!r}")
    ds = litdata.StreamingDataset(path)

    def read(batches) -> int:
        if op == "item":
            for i in batches:
                ds[i]
            return len(batches)
        n = 0
        for _ in ds:
            n += 1
        return n

    reads = _Reads(read, rows, op, item_rows=LITDATA_ITEM_ROWS)
    reads.info["litdata"] = litdata.__version__
    return reads


class _Writes:
    """One epoch: every row written into a fresh directory; the previous epoch's output is removed untimed."""

    def __init__(self, write, rows: int):
        self.write, self.rows_list = write, make_rows(rows)
        self.items_per_epoch = rows
        self.root = Path(tempfile.mkdtemp(prefix="tbl-bench-columnar-"))
        self.dst: Path | None = None
        self.info: dict = {}

    def prepare_epoch(self, epoch: int) -> None:
        if self.dst is not None:
            shutil.rmtree(self.dst, ignore_errors=True) if self.dst.is_dir() else self.dst.unlink(missing_ok=True)
        self.dst = self.root / f"epoch-{epoch}"

    def run_epoch(self, epoch: int) -> int:
        self.write(self.rows_list, self.dst)
        self.info["bytes"] = _dir_bytes(self.dst)
        return len(self.rows_list)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def tbl_writes(rows: int, op: str = "write", compression: str | None = None):
    """Workload factory: tbl_format.write of every row per epoch (``op`` names the configuration's operation),
    variable-size leaves compressed with ``compression`` (None, "lz4" or "zstd")."""
    from tbl_format import write

    w = _Writes(lambda rs, dst: write(rs, dst, variable=["tags"], compression=compression), rows)
    w.info["compression"] = compression
    return w


def lance_writes(rows: int, op: str = "write"):
    """Workload factory: pa.Table.from_pylist + lance.write_dataset of every row per epoch."""
    import lance

    w = _Writes(lambda rs, dst: lance.write_dataset(_arrow_table(rs), str(dst)), rows)
    w.info["lance"] = lance.__version__
    return w


def hf_writes(rows: int, op: str = "write"):
    """Workload factory: ``Dataset.from_list(rows, features=...).save_to_disk`` of every row per epoch."""
    import datasets

    w = _Writes(_write_hf, rows)
    w.info["datasets"] = datasets.__version__
    return w


def litdata_writes(rows: int, op: str = "write"):
    """Workload factory: ``litdata.optimize`` of every row per epoch (1 worker)."""
    import litdata

    w = _Writes(_write_litdata, rows)
    w.info["litdata"] = litdata.__version__
    return w


def _peer_configs(ctx: BenchContext, rows: int, reads: dict, writes: dict) -> list[Config]:
    """Lance, HF datasets and litdata on the same rows, each in the peer interpreter."""
    configs = []
    peers = (("lance", "columnar-{rows}.lance", "write_lance", (*READ_OPS, "item")),
             ("hf", "columnar-{rows}.hf", "write_hf", (*READ_OPS, "item")),
             ("litdata", "columnar-{rows}.litdata", "write_litdata", ("scan", "item")))
    for peer, name, writer, ops in peers:
        try:
            path, skip = str(ctx.peer_artifact(name.format(rows=rows), {"kind": f"columnar-{peer}", "rows": rows},
                                               f"tbl_bench.suites.columnar:{writer}", {"rows": rows})), None
        except DataUnavailable as e:
            path, skip = "", str(e)
        configs += [Config(NAME, f"{peer}/{op}", peer, f"tbl_bench.suites.columnar:{peer}_reads",
                           {"path": path, "op": op, "rows": rows}, role="baseline" if peer == "lance" else "subject",
                           peer=True, skip=skip, **reads)
                    for op in ops]
        # litdata writes a row at a time through its worker: fewer rows, one timed epoch
        epochs, write_rows = ({"epochs": 1}, min(rows, LITDATA_WRITE_ROWS)) if peer == "litdata" else ({}, rows)
        configs.append(Config(NAME, f"{peer}/write", peer, f"tbl_bench.suites.columnar:{peer}_writes",
                              {"rows": write_rows, "op": "write"}, role="baseline" if peer == "lance" else "subject",
                              peer=True, **{**writes, **epochs}))
    return configs


def configurations(ctx: BenchContext) -> list[Config]:
    rows = QUICK_ROWS if ctx.quick else ctx.sizes.array_rows
    reads = {"warmup": 1, "epochs": 2 if ctx.quick else 5, "unit": UNIT, "rss": False,
             "preimport": ["numpy", "pyarrow"]}
    writes = {"warmup": 0, "epochs": 1 if ctx.quick else 3, "unit": UNIT, "rss": True,
              "preimport": ["numpy", "pyarrow"]}
    tbl_path = str(ctx.artifact(f"columnar-{rows}.tbl", {"kind": "columnar", "rows": rows},
                                lambda p: write_tbl(str(p), rows)))
    configs = [Config(NAME, f"tbl-{fmt}/{op}", "tbl", "tbl_bench.suites.columnar:tbl_reads",
                      {"path": tbl_path, "op": op, "fmt": fmt, "rows": rows}, **reads)
               for op in READ_OPS for fmt in ("arrow", "pytree")]
    configs.append(Config(NAME, "tbl/item", "tbl", "tbl_bench.suites.columnar:tbl_reads",
                          {"path": tbl_path, "op": "item", "fmt": "pytree", "rows": rows}, **reads))
    configs.append(Config(NAME, "tbl/write", "tbl", "tbl_bench.suites.columnar:tbl_writes", {"rows": rows, "op": "write"},
                          **writes))
    for codec in CODECS:
        path = str(ctx.artifact(f"columnar-{rows}-{codec}.tbl", {"kind": "columnar", "rows": rows, "compression": codec},
                                lambda p, codec=codec: write_tbl(str(p), rows, codec)))
        configs += [Config(NAME, f"tbl-{codec}-{fmt}/scan", "tbl", "tbl_bench.suites.columnar:tbl_reads",
                           {"path": path, "op": "scan", "fmt": fmt, "rows": rows}, **reads) for fmt in ("arrow", "pytree")]
        configs.append(Config(NAME, f"tbl-{codec}/write", "tbl", "tbl_bench.suites.columnar:tbl_writes",
                              {"rows": rows, "op": "write", "compression": codec}, **writes))
    if ctx.peers:
        configs += _peer_configs(ctx, rows, reads, writes)
    return configs


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Same-run ratios: TBL Arrow against get_batch and Lance, writes and sizes against Lance."""
    def rate(name: str) -> float | None:
        r = results.get(name) or {}
        return r.get("throughput")

    out = {}
    for op in READ_OPS:
        arrow, pytree, lance = rate(f"tbl-arrow/{op}"), rate(f"tbl-pytree/{op}"), rate(f"lance/{op}")
        if arrow and pytree:
            out[f"{op}: arrow vs get_batch"] = arrow / pytree
        if arrow and lance:
            out[f"{op}: arrow vs lance"] = arrow / lance
    for peer in ("lance", "hf", "litdata"):
        tbl_item, peer_item = rate("tbl/item"), rate(f"{peer}/item")
        if tbl_item and peer_item:
            out[f"item: tbl vs {peer}"] = tbl_item / peer_item
    for peer in ("hf", "litdata"):
        for op in READ_OPS:
            arrow, theirs = rate(f"tbl-arrow/{op}"), rate(f"{peer}/{op}")
            if arrow and theirs:
                out[f"{op}: arrow vs {peer}"] = arrow / theirs
    tw, lw = rate("tbl/write"), rate("lance/write")
    for peer in ("hf", "litdata"):
        pw = rate(f"{peer}/write")
        if tw and pw:
            out[f"write: tbl vs {peer} rows/s"] = tw / pw
    if tw and lw:
        out["write: tbl vs lance rows/s"] = tw / lw
    lb = ((results.get("lance/write") or {}).get("info") or {}).get("bytes")
    for codec in (None, *CODECS):
        name = "tbl/write" if codec is None else f"tbl-{codec}/write"
        tag = "tbl" if codec is None else f"tbl {codec}"
        w, b = rate(name), ((results.get(name) or {}).get("info") or {}).get("bytes")
        if codec is not None and w and tw:
            out[f"write: {tag} vs tbl rows/s"] = w / tw
        if codec is not None and w and lw:
            out[f"write: {tag} vs lance rows/s"] = w / lw
        if b and lb:
            out[f"size: {tag} / lance bytes"] = b / lb
        if codec is not None:
            scan, raw = rate(f"tbl-{codec}-arrow/scan"), rate("tbl-arrow/scan")
            if scan and raw:
                out[f"scan: {codec} arrow vs raw arrow"] = scan / raw
            if scan and rate("lance/scan"):
                out[f"scan: {codec} arrow vs lance"] = scan / rate("lance/scan")
    return out
