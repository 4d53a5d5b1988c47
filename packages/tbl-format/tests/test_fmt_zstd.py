"""zstd-compressed heaps (SPEC.md, "Columns"): every variable-size leaf kind reads back equal to the
uncompressed file, rows read at random, damaged frames are refused by name and never read as other bytes,
and a missing zstandard package is a named error."""

from __future__ import annotations

import itertools
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tbl_format as tf
from tbl_format import cli, codec
from tbl_format.schema import Leaf, Schema

np = pytest.importorskip("numpy")
zstd = pytest.importorskip("zstandard")

SCHEMA = Schema({
    "s": Leaf("str"), "b": Leaf("bytes"), "jpg": Leaf("encoded_image", format="jpeg"),
    "va": Leaf("var_array", dtype="float32", ndim=2), "vb": Leaf("var_array", dtype="int64", ndim=1),
    "li": Leaf("var_list", item="int"), "lf": Leaf("var_list", item="float"), "lb": Leaf("var_list", item="bool"),
    "ls": Leaf("var_list", item="str"), "os": Leaf("str", optional=True),
    "ova": Leaf("var_array", dtype="uint8", ndim=1, optional=True), "ol": Leaf("var_list", item="int", optional=True),
    "i": Leaf("int"), "x": Leaf("array", dtype="float32", shape=(4,)),
})
VAR_LEAVES = [p for p, leaf in SCHEMA.leaves.items() if not leaf.fixed_size]


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        k = rng.randrange(0, 40)
        rows.append({
            "s": "".join(rng.choice("abcdé☃ \n") for _ in range(rng.randrange(0, 200))),
            "b": bytes(rng.randrange(256) for _ in range(k)) * rng.randrange(1, 4),
            "jpg": b"\xff\xd8\xff" + bytes([i % 256]) * k,
            "va": np.arange(k * 3, dtype=np.float32).reshape(k, 3) * i,
            "vb": np.array([rng.randrange(-2**62, 2**62) for _ in range(k % 9)], dtype=np.int64),
            "li": [rng.randrange(-2**63, 2**63) for _ in range(k % 9)],
            "lf": [rng.random() for _ in range(k % 5)],
            "lb": [rng.random() < 0.5 for _ in range(k % 7)],
            "ls": ["t" * j + "ü" for j in range(k % 6)],
            "os": None if i % 3 == 0 else f"row {i}",
            "ova": None if i % 4 == 1 else np.full(k, i % 256, np.uint8),
            "ol": None if i % 5 == 2 else list(range(k % 4)),
            "i": i, "x": np.full(4, i, np.float32),
        })
    return rows


def same_row(got: dict, want: dict) -> bool:
    for key, v in want.items():
        g = got[key]
        if isinstance(v, np.ndarray):
            if not (isinstance(g, np.ndarray) and g.dtype == v.dtype and np.array_equal(g, v)):
                return False
        elif g != v or type(g) is not type(v):
            return False
    return True


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same 3,000 rows (several 64 KiB blocks per heap) without compression and with zstd."""
    d = tmp_path_factory.mktemp("zstd")
    rows = make_rows(3000)
    plain = tf.write(rows, d / "plain.tbl", schema=SCHEMA)
    packed = tf.write(rows, d / "zstd.tbl", schema=SCHEMA, compression="zstd")
    return rows, plain, packed


def test_every_variable_leaf_kind_reads_back_equal_to_uncompressed(files, hdr):
    rows, plain, packed = files
    header = hdr.read(packed)
    for col in header["columns"]:
        leaf = SCHEMA.leaves[col["path"]]
        if leaf.fixed_size:
            assert col.get("compression") is None
        else:
            assert col["compression"]["codec"] == "zstd" and col["compression"]["block"] == 64 * 1024
    a, b = tf.open(plain), tf.open(packed, verify=True)
    got_plain, got_zstd = list(a), list(b)
    assert len(got_zstd) == len(rows)
    assert all(same_row(z, r) and same_row(p, r) for z, p, r in zip(got_zstd, got_plain, rows, strict=True))
    for path in VAR_LEAVES:  # per-leaf reads and the decoded buffers
        idx = [5, 2999, 0, 1500]
        assert all(same_row({path: g}, {path: rows[i][path]}) for g, i in zip(b.values(path, idx), idx, strict=True))
        pb, zb = a.shard(0).buffers(path), b.shard(0).buffers(path)
        assert zb.compressed and not pb.compressed
        assert bytes(zb.heap) == bytes(pb.heap) and bytes(zb.offsets) == bytes(pb.offsets)
    assert packed.stat().st_size < plain.stat().st_size


def test_random_access(files):
    rows, _, packed = files
    ds = tf.open(packed)
    order = list(range(len(rows)))
    random.Random(1).shuffle(order)
    for i in order[:800]:
        assert same_row(ds[i], rows[i]), i
    for a, b in [(0, 1), (17, 400), (2990, 3000), (1234, 1235)]:
        assert all(same_row(g, r) for g, r in zip(ds.shard(0).read_range(a, b), rows[a:b], strict=True))


def test_rows_spanning_several_blocks(tmp_path):
    big = [{"s": f"{i:07d}" * 30_000, "b": random.Random(i).randbytes(150_000)} for i in range(6)]
    ds = tf.open(tf.write(big, tmp_path / "big.tbl", compression="zstd"), verify=True)
    for i in (3, 0, 5, 1):
        assert ds[i] == big[i]
    assert list(ds) == big


def test_blocks_are_single_checked_frames(files, hdr):
    """Each block of the heap is one zstd frame declaring its content size and carrying a checksum."""
    rows, _, packed = files
    col = next(c for c in hdr.read(packed)["columns"] if c["path"] == "s")
    raw = packed.read_bytes()
    heap, index = col["regions"]["heap"], col["regions"]["index"]
    offs = struct.unpack_from(f"<{index['size'] // 8}Q", raw, index["offset"])
    block, raw_size = col["compression"]["block"], col["compression"]["raw_size"]
    assert raw_size == sum(len(r["s"].encode()) for r in rows) and len(offs) == -(-raw_size // block) + 1
    for k, (a, b) in enumerate(itertools.pairwise(offs)):
        frame = raw[heap["offset"] + a : heap["offset"] + b]
        assert frame[:4] == b"\x28\xb5\x2f\xfd"
        params = zstd.get_frame_parameters(frame)
        assert params.content_size == min(block, raw_size - k * block) and params.has_checksum
        assert params.dict_id == 0 and params.window_size <= block
        assert len(zstd.ZstdDecompressor().decompress(frame)) == params.content_size


def test_levels(tmp_path):
    rows = make_rows(600, seed=2)
    sizes = {}
    for level in (-5, 1, 3, 19):
        path = tf.write(rows, tmp_path / f"l{level}.tbl", schema=SCHEMA, compression="zstd", compression_level=level)
        assert all(same_row(g, r) for g, r in zip(tf.open(path, verify=True), rows, strict=True))
        sizes[level] = path.stat().st_size
    assert sizes[19] <= sizes[3] <= sizes[-5]
    with pytest.raises(ValueError, match="compression_level"):
        tf.Writer(tmp_path / "bad.tbl", compression="zstd", compression_level=10**6)
    with pytest.raises(TypeError, match="compression_level"):
        tf.Writer(tmp_path / "bad.tbl", compression="zstd", compression_level="3")
    with pytest.raises(ValueError, match="compression_level"):
        tf.write(rows, tmp_path / "bad.tbl", compression_level=3)
    assert not (tmp_path / "bad.tbl").exists()


def test_sharded_and_widened_writes(tmp_path):
    """Shards and a schema widened mid-write (rows rewritten) keep the codec."""
    rows = [{"v": np.full(3, i, np.int16), "s": str(i)} for i in range(300)]
    rows += [{"v": np.arange(i % 7, dtype=np.int16), "s": "w" * i} for i in range(300)]
    d = tf.write(rows, tmp_path / "d", shard_rows=250, compression="zstd")
    ds = tf.open(d, verify=True)
    assert all(np.array_equal(g["v"], r["v"]) and g["s"] == r["s"] for g, r in zip(ds, rows, strict=True))
    for k in range(3):
        info = ds.shard(k).describe()["columns"]
        assert info["s"]["compression"] == "zstd" and info["v"]["compression"] == "zstd"


def _damage_heap(path, hdr, leaf: str, at: int, mask: int = 0x5A) -> None:
    heap = hdr.region(path, leaf, "heap")
    raw = bytearray(path.read_bytes())
    raw[heap["offset"] + at] ^= mask
    path.write_bytes(bytes(raw))


def test_damaged_block_is_refused_by_name_when_read(tmp_path, hdr):
    rows = [{"s": f"row {i} " * (i % 40)} for i in range(5000)]
    path = tf.write(rows, tmp_path / "c.tbl", compression="zstd")
    _damage_heap(path, hdr, "s", 200)  # inside block 0's compressed data
    ds = tf.open(path)  # opening reads no heap block
    with pytest.raises(tf.CorruptDataError, match=r"leaf 's': zstd block 0 "):
        ds[1]  # row 0 is empty: row 1 is the first to read block 0
    assert ds[4999] == rows[4999]  # other blocks still read
    with pytest.raises(tf.DataChecksumError):
        tf.open(path).verify()


def test_cli_inspect_and_verify(tmp_path, hdr, capsys, monkeypatch):
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    path = tf.write([{"i": i, "s": "zstd text " * (i % 50)} for i in range(2000)], tmp_path / "c.tbl",
                    compression="zstd")
    assert cli.main(["inspect", str(path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("s "))
    assert "zstd ratio" in line
    assert cli.main(["inspect", "--json", str(path)]) == 0
    assert '"compression": "zstd"' in capsys.readouterr().out
    assert cli.main(["verify", str(path)]) == 0
    assert "OK" in capsys.readouterr().out
    _damage_heap(path, hdr, "s", 100)
    assert cli.main(["verify", str(path)]) == 1
    assert "DataChecksumError" in capsys.readouterr().err


# ---- frames that break a rule of SPEC.md, fed to the decoder one by one ---------------------------------------


def _decode(frame: bytes, raw_len: int, block: int = 64 * 1024) -> bytes:
    return codec.block_decoder("zstd", block, "f.tbl: leaf 's'")(frame, 7, raw_len)


def test_frames_breaking_the_spec_are_corrupt_data():
    data = b"abcdefgh" * 1000
    good = zstd.ZstdCompressor(level=3, write_checksum=True).compress(data)
    assert _decode(good, len(data)) == data
    cases = {
        "content size": (good, len(data) - 1),
        "no content size": (zstd.ZstdCompressor(write_checksum=True, write_content_size=False).compress(data),
                            len(data)),
        "no content checksum": (zstd.ZstdCompressor(write_checksum=False).compress(data), len(data)),
        "unused data": (good + b"\x00", len(data)),
        "two frames": (good + good, len(data)),
        "empty": (b"", len(data)),
        "skippable": (struct.pack("<II", 0x184D2A50, 4) + b"xxxx" + good, len(data)),
    }
    for why, (frame, raw_len) in cases.items():
        with pytest.raises(tf.CorruptDataError, match="zstd block 7"):
            _decode(frame, raw_len)
        assert why
    # A window larger than the block (rounded up to a power of two): 128 KiB declared by a frame of a
    # 4 KiB block; the one-shot decoder itself would not mind.
    content = random.Random(3).randbytes(4000)
    params = zstd.ZstdCompressionParameters.from_level(3, window_log=17, write_checksum=1, write_content_size=0)
    plain = zstd.ZstdCompressor(compression_params=params).compress(content)
    # The encoder shrinks the window to the input, so write the header by hand: Frame_Header_Descriptor bits
    # 7-6 = 1 (a 2-byte Frame_Content_Size, stored minus 256, after the Window_Descriptor at byte 5), and a
    # Window_Descriptor of exponent 7 (2**17 bytes). A larger window than the data uses decodes the same.
    assert plain[4] & 0xE0 == 0  # no content size, not single-segment: byte 5 is the window descriptor
    wide = plain[:4] + bytes([plain[4] | 0x40, 7 << 3]) + struct.pack("<H", len(content) - 256) + plain[6:]
    assert zstd.get_frame_parameters(wide).window_size > 4096
    assert zstd.ZstdDecompressor().decompress(wide) == content
    with pytest.raises(tf.CorruptDataError, match="zstd block 7 declares a window"):
        _decode(wide, 4000, block=4096)


def test_missing_zstandard_is_a_named_error(tmp_path, monkeypatch):
    path = tf.write([{"s": "abc" * i} for i in range(100)], tmp_path / "z.tbl", compression="zstd")
    monkeypatch.setattr(codec, "_zstd", None)  # as if zstandard were not installed
    with pytest.raises(tf.CompressionUnavailableError, match=r"pip install 'tbl-format\[zstd\]'"):
        tf.Writer(tmp_path / "w.tbl", compression="zstd")
    assert not list(tmp_path.glob(".w.tbl*")) and not (tmp_path / "w.tbl").exists()
    with pytest.raises(tf.CompressionUnavailableError, match=r"pip install 'tbl-format\[zstd\]'"):
        tf.open(path)[3]
    with pytest.raises(ImportError):  # CompressionUnavailableError is also an ImportError
        tf.open(path).shard(0).buffers("s")


# ---- fuzzing the decoder path ---------------------------------------------------------------------------------

FUZZ_ROWS = make_rows(400, seed=9)


@pytest.fixture(scope="module")
def fuzz_seed(tmp_path_factory):
    path = tf.write(FUZZ_ROWS, tmp_path_factory.mktemp("fz") / "seed.tbl", schema=SCHEMA, compression="zstd")
    raw = path.read_bytes()
    from tbl_format.layout import PREAMBLE, PREAMBLE_SIZE

    hlen = PREAMBLE.unpack_from(raw, 0)[3]
    import json

    header = json.loads(raw[PREAMBLE_SIZE : PREAMBLE_SIZE + hlen])
    heaps = [c["regions"]["heap"] for c in header["columns"] if c.get("compression")]
    return raw, [(h["offset"], h["size"]) for h in heaps if h["size"]]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_fuzzed_frames_never_read_as_other_bytes(fuzz_seed, tmp_path_factory, data):
    """Bytes of a compressed heap flipped or overwritten: reading raises CorruptDataError or returns the
    original rows exactly (the frame checksum), never another value and never another exception."""
    raw, heaps = fuzz_seed
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        off, size = data.draw(st.sampled_from(heaps))
        pos = off + data.draw(st.one_of(st.integers(0, min(size - 1, 40)), st.integers(0, size - 1)))
        if data.draw(st.booleans()):
            out[pos] ^= 1 << data.draw(st.integers(0, 7))
        else:
            out[pos] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("fz") / "damaged.tbl"
    path.write_bytes(bytes(out))
    ds = tf.open(path)  # heaps are not read at open
    try:
        for i in data.draw(st.lists(st.integers(0, len(FUZZ_ROWS) - 1), min_size=1, max_size=20)):
            assert same_row(ds[i], FUZZ_ROWS[i]), i
        got = list(ds)
    except tf.CorruptDataError:
        return
    assert all(same_row(g, r) for g, r in zip(got, FUZZ_ROWS, strict=True))
