"""Fuzzing the readers: damaged files raise FormatError subclasses only, never anything else, never hang.

Each case builds a file from a valid seed (native and TBL v2, with and without
compression) by flipping, overwriting, inserting or deleting bytes, truncating,
editing header and index fields, with the header and table CRCs refreshed (most
of the time) so that the damage reaches the rules behind them, or from random bytes; then opens it, reads every row (by index
and in order), touches every fixed-size column view, describes it and verifies it.

The CI profile runs a few hundred cases with a fixed seed. A long run:

    TBL_FUZZ_EXAMPLES=25000 python -m pytest packages/tbl-format/tests/test_fuzz.py \\
        -p no:cacheprovider --hypothesis-seed=1 -q

in a subprocess of its own, so that an interpreter crash shows up as an exit status.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import json
import os
import signal
import struct
import threading
import zlib
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tbl_format as tf
import tbl_format.reader as native_reader
from tbl_format import turboloader as v2

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = int(os.environ.get("TBL_FUZZ_EXAMPLES", "200"))
CASE_SECONDS = float(os.environ.get("TBL_FUZZ_CASE_SECONDS", "5"))
# Rows touched per case: a damaged header may legally claim 2**60 rows of zero-byte leaves.
MAX_ROWS = 2000
NATIVE_MAGIC = b"\x89TBL\r\n\x1a\n"
V2_MAGIC = b"TBL\x02"
INTERESTING = [0, 1, 2, 3, 7, 8, 63, 64, 255, 256, 4095, 4096, 4097, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**40, 2**53, 2**63 - 1, 2**63, 2**64 - 4096, 2**64 - 1]


class CaseTimeout(BaseException):
    """A case ran past CASE_SECONDS. BaseException so that no reader's ``except Exception`` can swallow it."""


def _on_alarm(signum, frame):
    raise CaseTimeout(f"a fuzz case ran longer than {CASE_SECONDS} s")


def _golden_module():
    spec = importlib.util.spec_from_file_location("tbl_golden_make", GOLDEN / "make_golden.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    return mg


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


@functools.lru_cache(maxsize=1)
def seeds() -> tuple[bytes, ...]:
    """Valid files to damage: the golden ones plus, where numpy and lz4 (zstandard) exist, a native file with every
    leaf kind compressed with LZ4 (zstd)."""
    names = ["native_valid.tbl", "native_valid_small.tbl", "native_valid_v11.tbl", "v2_valid_raw.tbl",
             "v2_valid_mixed.tbl", "v2_valid_gapped.tbl", "v2_valid_empty.tbl"]
    if _has("lz4"):
        names.append("v2_valid_lz4.tbl")
    if _has("zstandard"):
        names.append("native_valid_zstd.tbl")
    out = [(GOLDEN / n).read_bytes() for n in names]
    codecs = [c for c, mod in (("lz4", "lz4"), ("zstd", "zstandard")) if _has(mod)]
    if _has("numpy") and codecs:
        import tempfile

        import numpy as np

        schema = tf.Schema({
            "img": tf.Leaf("image", shape=(2, 2, 3)), "va": tf.Leaf("var_array", dtype="float32", ndim=2),
            "b": tf.Leaf("bytes"), "s": tf.Leaf("str"), "f": tf.Leaf("float"), "ok": tf.Leaf("bool"),
            "t": (tf.Leaf("int"), [tf.Leaf("str")]), "ls": tf.Leaf("var_list", item="str", optional=True),
            "lf": tf.Leaf("var_list", item="float"), "oa": tf.Leaf("array", dtype="int16", shape=(2,), optional=True),
            "ov": tf.Leaf("var_array", dtype="uint8", ndim=1, optional=True), "none": tf.Leaf("none"),
        })
        rows = [{"img": np.full((2, 2, 3), i, np.uint8), "va": np.ones((i, 2), np.float32), "b": b"x" * i * 9,
                 "s": "s" * i * 20, "f": i / 3, "ok": i % 2 == 0, "t": (i, [f"{i}"]),
                 "ls": None if i == 1 else ["ab" * i] * i, "lf": [i / 2] * i, "oa": None if i == 0 else np.ones(2, np.int16),
                 "ov": None if i == 2 else np.arange(i, dtype=np.uint8), "none": None} for i in range(3)]
        with tempfile.TemporaryDirectory() as tmp:
            for c in codecs:
                out.append(tf.write(rows, Path(tmp) / f"rich-{c}.tbl", schema=schema, compression=c).read_bytes())
    return tuple(out)


def refresh_crc(raw: bytearray) -> None:
    """Recompute the header CRC of a native or v2 file in place, where the header is present."""
    if raw[:8] == NATIVE_MAGIC and len(raw) >= 32:
        hlen = struct.unpack_from("<I", raw, 12)[0]
        if 32 + hlen <= len(raw):
            raw[24:28] = struct.pack("<I", zlib.crc32(bytes(raw[32 : 32 + hlen]), zlib.crc32(bytes(raw[:24]))))
    elif raw[:4] == V2_MAGIC and len(raw) >= 64:
        raw[44:48] = bytes(4)
        raw[44:48] = struct.pack("<I", zlib.crc32(bytes(raw[:64])))


def refresh_tables(raw: bytearray) -> None:
    """Recompute every table CRC-32 a native header lists (offsets, shapes, index, checksums), then the header CRC.

    So damage inside those tables reaches the per-access checks and the decoders instead of stopping at open.
    """
    if raw[:8] != NATIVE_MAGIC or len(raw) < 32:
        return
    hlen = struct.unpack_from("<I", raw, 12)[0]
    try:
        header = json.loads(bytes(raw[32 : 32 + hlen]))
        regions = [r for c in header["columns"] for r in c["regions"].values()] + [header["checksums"]]
        for r in regions:
            if "crc32" in r and 0 <= r["offset"] <= r["offset"] + r["size"] <= len(raw):
                r["crc32"] = zlib.crc32(bytes(raw[r["offset"] : r["offset"] + r["size"]]))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        refresh_crc(raw)  # the header itself is damaged: let the reader's JSON checks see it
        return
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if 32 + len(text) > 4096:
        refresh_crc(raw)
        return
    raw[32 : 32 + max(hlen, len(text))] = text.ljust(max(hlen, len(text)), b" ")
    struct.pack_into("<I", raw, 12, len(text))
    refresh_crc(raw)


def _json_edit(raw: bytes, which: int, value: object, drop: bool) -> bytes:
    """Set (or delete) the which-th scalar of a native header's JSON, rewrite the header and refresh its CRC."""
    hlen = struct.unpack_from("<I", raw, 12)[0]
    header = json.loads(raw[32 : 32 + hlen])
    slots = []

    def walk(node):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            if isinstance(v, (dict, list)):
                walk(v)
            slots.append((node, k))

    walk(header)
    node, key = slots[which % len(slots)]
    if drop and isinstance(node, dict):
        del node[key]
    else:
        node[key] = value
    text = json.dumps(header, separators=(",", ":")).encode()
    out = bytearray(raw[:32]) + text + raw[32 + len(text) :] if 32 + len(text) < len(raw) else bytearray(raw[:32]) + text
    struct.pack_into("<I", out, 12, len(text))
    refresh_crc(out)
    return bytes(out)


# (offset, width) of every v2 header field after the magic, and of every index entry field (relative).
V2_HEADER_FIELDS = [(4, 4), (8, 8), (16, 4), (20, 4), (24, 8), (32, 8), (40, 4), (48, 8)]
V2_ENTRY_FIELDS = [(0, 8), (8, 4), (12, 4), (16, 2), (18, 2), (20, 1), (21, 1), (22, 2)]


def _v2_field_edit(raw: bytes, which: int, value: int) -> bytes:
    """Set one v2 header or index field to value (truncated to its width) and refresh the header CRC."""
    n = min(struct.unpack_from("<Q", raw, 8)[0], (len(raw) - 64) // 24)
    fields = V2_HEADER_FIELDS + [(64 + 24 * k + o, w) for k in range(n) for o, w in V2_ENTRY_FIELDS]
    off, width = fields[which % len(fields)]
    out = bytearray(raw)
    out[off : off + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    refresh_crc(out)
    return bytes(out)


@st.composite
def damaged(draw) -> bytes:
    seed = draw(st.sampled_from(seeds()))
    kind = draw(st.sampled_from(["ops"] * 5 + ["json"] * 3 + ["truncate", "random"]))
    if kind == "random":
        prefix = draw(st.sampled_from([b"", NATIVE_MAGIC, V2_MAGIC]))
        return prefix + draw(st.binary(max_size=400))
    if kind == "truncate":
        # Counted from the end: hypothesis favours small numbers, and short cuts reach deeper rules.
        return seed[: len(seed) - 1 - draw(st.integers(0, len(seed) - 1))]
    if kind == "json":
        if seed[:4] == V2_MAGIC:
            return _v2_field_edit(seed, draw(st.integers(0, 10_000)), draw(st.sampled_from(INTERESTING)))
        value = draw(st.one_of(st.sampled_from(INTERESTING), st.integers(-(2**64), 2**65), st.sampled_from(
            [-1, None, True, "x", "lz4", "zstd", "int", "image", [], {}, [2**40], [0, 0, 0], 1.5])))
        return _json_edit(seed, draw(st.integers(0, 10_000)), value, draw(st.booleans()))
    raw = bytearray(seed)
    n_ops = draw(st.integers(1, 4))
    for _ in range(n_ops):
        if not raw:
            break
        n = len(raw)
        # Positions: the header and v2 index (past the magic, which one check guards), the data (counted
        # from the end: hypothesis favours small numbers) and native region starts.
        pos = draw(st.one_of(
            st.integers(min(8, n - 1), max(min(8, n - 1), min(n, 512) - 1)),
            st.integers(0, n - 1).map(lambda k, n=n: n - 1 - k),
            st.integers(0, (n - 1) // 4096).flatmap(lambda k, n=n: st.integers(k * 4096, min(n - 1, k * 4096 + 64))),
        ))
        op = draw(st.sampled_from(["flip", "int", "int", "insert", "delete"]))
        if op == "flip":
            raw[pos] ^= draw(st.integers(1, 255))
        elif op == "int":
            width = draw(st.sampled_from([1, 2, 4, 8]))
            value = draw(st.sampled_from(INTERESTING)) % (1 << (8 * width))
            raw[pos : pos + width] = value.to_bytes(width, "little")[: max(0, n - pos)]
        elif op == "insert":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del raw[pos : pos + draw(st.integers(1, 64))]
    fix = draw(st.sampled_from(["tables", "tables", "header", "none"]))
    if fix == "tables":
        refresh_tables(raw)
    elif fix == "header":
        refresh_crc(raw)
    return bytes(raw)


def _touch(x) -> None:
    """Read every byte of a column view (a view past the end of the file would fault here)."""
    if hasattr(x, "sum"):
        x.sum()
    else:
        memoryview(x).tobytes()


def exercise(path: Path) -> None:
    """open, read, touch columns, describe, verify: only FormatError may escape."""
    try:
        ds = tf.open(path)
    except tf.FormatError:
        return
    try:
        n = len(ds)
        for i in itertools.chain(range(min(n, MAX_ROWS)), range(-1, -min(n, 3) - 1, -1)):
            ds[i]
        for _ in itertools.islice(ds, MAX_ROWS):
            pass
        rows = list(range(min(n, MAX_ROWS)))
        for leaf, spec in ds.schema.leaves.items():
            ds.values(leaf, rows)
            if spec.fixed_size and spec.kind != "none":  # a none leaf has no values, hence no column
                for col in ds.segments(leaf):
                    _touch(col)
            if spec.optional:
                for col in ds.present_segments(leaf):
                    _touch(col)
        ds.shard(0).describe()
        ds.verify()
    except tf.FormatError:
        pass
    finally:
        ds.close()


_counter = itertools.count()


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs SIGALRM")
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize="TBL_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(data=damaged(), hide_numpy=st.booleans())
def test_damaged_files_raise_only_format_errors(case_dir, data, hide_numpy):
    # A fresh name per case: a file is never rewritten while an earlier case's map of it might live.
    path = case_dir / f"case{next(_counter)}.tbl"
    path.write_bytes(data)
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        with contextlib.ExitStack() as stack:
            if hide_numpy:  # the readers' pure-Python paths (no numpy installed)
                stack.enter_context(mock.patch.object(v2, "_numpy", lambda: None))
                stack.enter_context(mock.patch.object(native_reader, "_numpy", lambda: None))
            exercise(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        path.unlink()


def test_seeds_are_valid():
    """The fuzz starts from files that read cleanly, so every failure comes from the damage."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for k, seed in enumerate(seeds()):
            p = Path(tmp) / f"seed{k}.tbl"
            p.write_bytes(seed)
            ds = tf.open(p, verify=True)
            assert len(list(ds)) == len(ds)
            ds.close()
