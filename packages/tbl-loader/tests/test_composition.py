"""Every sample kind through every path users combine it with, against the plain local loader.

Kinds: fixed-size raw images, variable-size raw images, variable-size JPEG images, pytree rows,
token windows; the three image kinds twice, with RandomResizedCrop and with the evaluation
transform (``resize=`` + ``center_crop=``: the ``_eval`` kinds, on the same datasets). Paths: the
loader with a producer thread, a mid-epoch resume, two ranks, a URL (loopback S3, cache a quarter
of the dataset), ``fields=``, a map-style dataset in a torch DataLoader with two workers under
fork / spawn / forkserver, and Mix.

Each cell either yields what the plain local loader (``prefetch=0``) yields, compared element by
element, or raises the named error that the README's table of refused combinations lists for it;
the table is read from the README, so a cell that starts working (or stops) fails here until the
table says so.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import PER_SAMPLE, assert_tree_equal

import tbl_format
import tbl_loader
from tbl_loader import (
    EpochBatchSampler,
    ImageDataset,
    ImageLoader,
    Mix,
    PyTreeDataset,
    PyTreeLoader,
    RandomResizedCrop,
    TokenDataset,
    TokenLoader,
    collate_identity,
    upload_dataset,
    write_tokens,
)

torch = pytest.importorskip("torch")

README = Path(__file__).resolve().parents[1] / "README.md"
ROWS, SHARD_ROWS, BATCH, SEED = 48, 8, 8, 5
# Variable-size kinds need tbl-kernels 0.2; with the oldest kernels the pin admits, their cells are not collected.
IMAGE_KINDS = ("fixed", *(("variable_raw", "variable_jpeg") if PER_SAMPLE else ()))
# Each image kind again with the evaluation transform, read from the same dataset as its RandomResizedCrop twin
# (its resize-crop call is tbl-kernels 0.2's too, on fixed-size images as well).
EVAL_SUFFIX = "_eval"
EVAL_KINDS = tuple(kind + EVAL_SUFFIX for kind in IMAGE_KINDS) if PER_SAMPLE else ()
KINDS = (*IMAGE_KINDS, *EVAL_KINDS, "pytree", "tokens")
PATHS = ("prefetch", "resume", "two_ranks", "url", "fields", "dataloader_fork", "dataloader_spawn",
         "dataloader_forkserver", "mix", "mix_url")
# Cells that do not exist: a token stream has no per-sample leaves to select.
NOT_APPLICABLE = {("tokens", "fields")}


def _refused() -> dict[tuple[str, str], str]:
    """``(kind, path) -> error name`` from the README's table of refused combinations."""
    text = README.read_text()
    table = text[text.index("<!-- refused-combinations -->"):text.index("<!-- /refused-combinations -->")]
    cells = {}
    for kind, path, error in re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", table, re.M):
        cells[(kind, path)] = error
    return cells


REFUSED = _refused()


# ---- datasets: the same small dataset of each kind, local and uploaded ---------------------------------------


def _pixels(rng, h, w):
    y, x = np.mgrid[0:h, 0:w]
    return ((rng.integers(0, 256, 3) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)


def _write(kind: str, root: Path) -> Path:
    rng = np.random.default_rng(KINDS.index(kind))
    if kind == "tokens":
        docs = [rng.integers(1, 60_000, int(rng.integers(20, 200)), dtype=np.int64) for _ in range(120)]
        return write_tokens(docs, root / kind, eos=0, chunk=256, shard_tokens=2048)
    if kind == "pytree":
        rows = ({"id": i, "text": f"row {i} " + "y" * int(rng.integers(0, 20)),
                 "tokens": rng.integers(0, 1000, int(rng.integers(0, 12)), dtype=np.int32),
                 "x": rng.random(3, dtype=np.float32)} for i in range(ROWS))
        return tbl_format.write(rows, root / kind, shard_rows=SHARD_ROWS)
    if kind == "fixed":
        rows = ({"image": _pixels(rng, 16, 14), "label": np.int64(i), "caption": f"photo {i}"} for i in range(ROWS))
        return tbl_format.write(rows, root / kind, shard_rows=SHARD_ROWS)
    if kind == "variable_jpeg":
        simplejpeg = pytest.importorskip("simplejpeg")
        image = tbl_format.Leaf("encoded_image", format="jpeg")
    else:
        image = tbl_format.Leaf("var_array", dtype="uint8", ndim=3)
    schema = tbl_format.Schema({"image": image, "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int"), "caption": tbl_format.Leaf("str")})
    with tbl_format.Writer(root / kind, schema, shard_rows=SHARD_ROWS) as w:
        for i in range(ROWS):
            h, wd = (int(v) for v in rng.integers(20, 60, 2))
            pixels = _pixels(rng, h, wd)
            stored = simplejpeg.encode_jpeg(pixels, quality=90, colorspace="RGB") if kind == "variable_jpeg" else pixels
            w.write({"image": stored, "height": h, "width": wd, "label": i, "caption": f"photo {i}"})
    return root / kind


def _dataset_kind(kind: str) -> str:
    """The kind whose dataset ``kind`` reads (an ``_eval`` kind reads its RandomResizedCrop twin's)."""
    return kind.removesuffix(EVAL_SUFFIX)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    written = {kind: _write(kind, root) for kind in KINDS if _dataset_kind(kind) == kind}
    return {kind: written[_dataset_kind(kind)] for kind in KINDS}


@pytest.fixture(scope="module")
def urls(s3_server, local):
    bucket = s3_server.new_bucket()
    uploaded = {}
    for kind in KINDS:
        if _dataset_kind(kind) == kind:
            uploaded[kind] = f"s3://{bucket}/{kind}/"
            upload_dataset(local[kind], uploaded[kind], storage_options=s3_server.storage_options)
    return {kind: uploaded[_dataset_kind(kind)] for kind in KINDS}


# ---- how each kind is read, and what one sample is --------------------------------------------------------


def _image_options(kind: str) -> dict:
    if kind.endswith(EVAL_SUFFIX):
        # Shorter side to 10, centre 8 x 8: a JPEG's window of 16-48 px decodes at DCT scale 1/2 or 1/4.
        return {"random_resized_crop": None, "resize": 10, "center_crop": 8, "hflip": 0.5, "backend": "numpy"}
    return {"random_resized_crop": RandomResizedCrop(12, scale=(0.3, 1.0)), "hflip": 0.5, "backend": "numpy"}


def _loader(kind: str, path, **kw):
    kw.setdefault("prefetch", 0)
    common = {"batch_size": BATCH, "seed": SEED, **kw}
    if kind == "tokens":
        # With the boundary fields, so every cell compares them too (position_ids, document_ids, ...)
        return TokenLoader(path, seq_len=30, backend="numpy", boundaries=True, **common)
    if kind == "pytree":
        return PyTreeLoader(path, backend="numpy", return_indices=True, **common)
    return ImageLoader(path, **_image_options(kind), **common)


def _samples(kind: str, batch) -> list:
    """One comparable entry per sample: ``(row, content)``; a token window's row is its window number, its
    content the window's tokens and boundary fields."""
    if kind == "tokens":
        names = ("tokens", "position_ids", "document_ids", "cu_seqlens", "loss_mask")
        return [(row, {name: np.array(getattr(batch, name)[k]) for name in names})
                for k, row in enumerate(np.asarray(batch.indices).tolist())]
    if kind == "pytree":
        tree, rows = batch
        out = []
        for k, row in enumerate(np.asarray(rows).tolist()):
            out.append((row, {leaf: (value[k] if isinstance(value, list) else np.array(value[k]))
                              for leaf, value in tree.items()}))
        return out
    fields = {name: value for name, value in batch.fields.items()}
    rows = np.asarray(batch.indices).tolist()
    return [(row, (np.array(batch.images[k]), np.array(batch.labels[k]),
                   {name: value[k] for name, value in fields.items()})) for k, row in enumerate(rows)]


def _epoch(kind: str, loader, batches: int | None = None) -> list:
    out, it = [], iter(loader)
    for k, batch in enumerate(it):
        out.extend(_samples(kind, batch))
        if batches is not None and k + 1 == batches:
            break
    return out


def _assert_same(got: list, want: list, where: str) -> None:
    assert len(got) == len(want), where
    for (row_g, g), (row_w, w) in zip(got, want, strict=True):
        assert row_g == row_w, where
        assert_tree_equal(g, w, where)


def _assert_same_rows(got: list, want: list, where: str) -> None:
    """The same samples as ``want`` whatever their order (each row's content equal)."""
    by_row = dict(want)
    assert Counter(r for r, _ in got) == Counter(r for r, _ in want), where
    for row, content in got:
        assert_tree_equal(content, by_row[row], f"{where}: row {row}")


@pytest.fixture(scope="module")
def reference(local):
    """The plain local loader's epochs 0 and 1 of every kind."""
    out = {}
    for kind in KINDS:
        with _loader(kind, local[kind]) as loader:
            out[kind] = [_epoch(kind, loader) for _ in range(2)]
    return out


# ---- the cells ---------------------------------------------------------------------------------------------


def _prefetch(kind, local, reference, **_):
    with _loader(kind, local[kind], prefetch=3) as loader:
        got = [_epoch(kind, loader) for _ in range(2)]
    for epoch in range(2):
        _assert_same(got[epoch], reference[kind][epoch], f"{kind} prefetch epoch {epoch}")


def _resume(kind, local, reference, **_):
    with _loader(kind, local[kind], prefetch=2) as first:
        head = _epoch(kind, first, batches=3)
        state = first.state_dict()
    with _loader(kind, local[kind], prefetch=2) as resumed:
        resumed.load_state_dict(state)
        tail = _epoch(kind, resumed)
        after = _epoch(kind, resumed)
    _assert_same(head + tail, reference[kind][0], f"{kind} resumed epoch")
    _assert_same(after, reference[kind][1], f"{kind} epoch after the resumed one")


def _two_ranks(kind, local, reference, **_):
    got = []
    for rank in range(2):
        with _loader(kind, local[kind], rank=rank, world_size=2, padding="drop") as loader:
            got += _epoch(kind, loader)
    _assert_same_rows(got, reference[kind][0], f"{kind} two ranks")


def _quarter_cache(path) -> int:
    """A cache limit of a quarter of the dataset at ``path`` (at least two of its shards)."""
    sizes = [(path / e["file"]).stat().st_size for e in tbl_format.open(path).shard_entries]
    return max(sum(sizes) // 4, max(sizes) * 2)


def _url(kind, local, reference, urls, s3_server, tmp_path, **_):
    limit = _quarter_cache(local[kind])
    with _loader(kind, urls[kind], cache_dir=tmp_path, cache_limit=limit,
                 storage_options=s3_server.storage_options) as loader:
        got = []
        for _ in range(2):
            got.append(_epoch(kind, loader))
            cached = sum(f.stat().st_size for f in Path(tmp_path).rglob("*") if f.is_file() and f.suffix == ".tbl")
            assert cached <= limit
    for epoch in range(2):
        _assert_same(got[epoch], reference[kind][epoch], f"{kind} from a URL, epoch {epoch}")


def _fields(kind, local, reference, **_):
    if kind == "pytree":
        with _loader(kind, local[kind], fields=["id", "tokens"]) as loader:
            got = _epoch(kind, loader)
        want = [(row, {k: v for k, v in content.items() if k in ("id", "tokens")}) for row, content in
                reference[kind][0]]
        _assert_same(got, want, "pytree fields=")
        return
    with _loader(kind, local[kind], fields=["caption"]) as loader:
        got = _epoch(kind, loader)
    with tbl_format.open(local[kind]) as ds:
        want = [(row, (image, label, {"caption": ds[row]["caption"]})) for row, (image, label, _) in
                reference[kind][0]]
    _assert_same(got, want, f"{kind} fields=")


def _dataloader(context):
    def cell(kind, local, reference, **_):
        workers = {"num_workers": 2, "multiprocessing_context": context, "timeout": 120}
        with _loader(kind, local[kind]) as loader:
            if kind == "tokens":
                ds = TokenDataset.from_loader(loader)
            else:
                ds = PyTreeDataset(local[kind]) if kind == "pytree" else ImageDataset.from_loader(loader)
            dl = torch.utils.data.DataLoader(ds, batch_sampler=EpochBatchSampler(loader),
                                             collate_fn=collate_identity, **workers)
            batches = list(dl)
            if kind == "pytree":  # PyTreeDataset batches are the rows' trees: the sampler's plans name the rows
                batches = list(zip(batches, EpochBatchSampler(loader), strict=True))
            samples = [s for b in batches for s in _samples(kind, b)]
        _assert_same(samples, reference[kind][0], f"{kind} DataLoader workers ({context})")
    return cell


def _mixed(kind, first, second, **first_options):
    """Every sample of epoch 0 of a Mix of two loaders of ``kind`` (the first made with ``first_options``)."""
    with _loader(kind, first, **first_options) as a, _loader(kind, second) as b:
        mix = Mix([a, b], batch_size=BATCH, seed=SEED, prefetch=0)
        try:
            ids = mix.epoch_order().indices
            src, pos, ep = mix.schedule(0)
            assert set(ep[ids].tolist()) == {0}
            got = []
            for k, batch in enumerate(mix):
                rows = pos[ids[k * BATCH:(k + 1) * BATCH]]
                got += _samples(kind, (batch, rows) if kind == "pytree" else batch)
        finally:
            mix.close()
    return got


def _mix(kind, local, reference, **_):
    got = _mixed(kind, local[kind], local[kind])
    _assert_same_rows(got, reference[kind][0] * 2, f"{kind} Mix of the dataset with itself")


def _mix_url(kind, local, reference, urls, s3_server, tmp_path, **_):
    """A Mix of the dataset at a URL (through a quarter cache; the Mix reads its shards ahead) and of the local
    dataset: sample for sample the Mix of two local copies."""
    got = _mixed(kind, urls[kind], local[kind], cache_dir=tmp_path, cache_limit=_quarter_cache(local[kind]),
                 storage_options=s3_server.storage_options)
    _assert_same(got, _mixed(kind, local[kind], local[kind]), f"{kind} Mix of a URL source and a local one")


CELLS = {"prefetch": _prefetch, "resume": _resume, "two_ranks": _two_ranks, "url": _url, "fields": _fields,
         "dataloader_fork": _dataloader("fork"), "dataloader_spawn": _dataloader("spawn"),
         "dataloader_forkserver": _dataloader("forkserver"), "mix": _mix, "mix_url": _mix_url}


@pytest.mark.parametrize(("kind", "path"), [(k, p) for k in KINDS for p in PATHS if (k, p) not in NOT_APPLICABLE])
def test_cell(kind, path, local, reference, request, tmp_path):
    extra = {}
    if path in ("url", "mix_url"):
        extra = {"urls": request.getfixturevalue("urls"), "s3_server": request.getfixturevalue("s3_server")}
    run = CELLS[path]
    refused = REFUSED.get((kind, path))
    if refused is None:
        run(kind, local, reference, tmp_path=tmp_path, **extra)
        return
    error = getattr(tbl_loader.errors, refused)
    with pytest.raises(error):
        run(kind, local, reference, tmp_path=tmp_path, **extra)


def test_the_refused_table_names_real_cells_and_errors():
    # The table may be empty (every cell works), but it is there: _refused() found both markers.
    text = README.read_text()
    assert "| kind | path | error | why |" in text[text.index("<!-- refused-combinations -->"):]
    for (kind, path), error in REFUSED.items():
        assert kind in KINDS and path in PATHS, (kind, path)
        assert issubclass(getattr(tbl_loader.errors, error), tbl_loader.errors.LoaderError), error
