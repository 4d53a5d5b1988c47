"""Tokenize a text corpus into a token dataset: ``tbl tokenize SRC DST --tokenizer tokenizer.json``.

Needs the HuggingFace ``tokenizers`` library (``pip install "tbl-loader[tokenize]"``, which also brings
``zstandard`` for ``.zst`` sources); Parquet sources need pyarrow (the ``parquet`` extra), `datasets`
folders the ``hf`` extra.

Sources
-------
``jsonl``: a JSON Lines file, plain (``.jsonl``, ``.json``), gzip (``.gz``) or zstandard (``.zst``)
compressed, or a folder of them (taken in name order; other files are ignored and counted). Every line
is a record: one JSON object holding the text field. A line that is not JSON (bad syntax, not UTF-8,
blank) is a bad record named ``FILE:LINE`` (1-based). ``parquet``: a ``.parquet`` file or a folder of
them, records named ``FILE:row N``. ``hf``: a `datasets` ``save_to_disk`` folder of one split, records
named ``row N``. The source is detected from SRC unless named (``source_format``).

What is stored
--------------
Each record's text is encoded with ``Tokenizer.encode_batch`` of the given ``tokenizer.json`` (its own
normalizer, pre-tokenizer and post-processor: ``add_special_tokens=True``, as the library does by
default; a tokenizer that pads or truncates is refused, since a corpus is stored whole) and written as one
document of a token dataset (`tbl_loader.tokens.write_tokens`), the end-of-document id ``eos`` appended:
``eos=ID``, or the tokenizer's own (``eos_token`` of a ``tokenizer_config.json`` beside the file, else the
one added special token spelled as an end of text: ``</s>``, ``<|endoftext|>``, ``<eos>``,
``<|end_of_text|>``); with neither, `TokenizerFileError` and nothing is written. Documents are stored in
source order, whatever the number of workers; the dtype is ``uint16`` when every id fits it, else
``uint32``. The dataset's metadata ``"tokenize"`` records the tokenizer file's SHA-256, the text field, the
eos and where it came from. `tbl_loader.TokenLoader` serves it, with its document index.

Bad records
-----------
A bad record (not JSON, without the text field, a text that is not a string) raises its named error
(`JsonLineError`, `TextFieldMissingError`, `TextFieldTypeError`, all `TextRecordError`) with
``on_error="fail"``, the first in source order, and nothing is published; with ``on_error="skip"`` it is
left out and listed in the report. A source that does not read (a corrupt gzip or zstandard stream, a
Parquet footer) raises `SourceError`.

Parallelism, parts and resume
-----------------------------
The parent reads the records in order and sends batches of them (raw JSONL lines, or texts) to
``workers`` processes, which parse, check and encode them (one thread each); results come back in order
within a bounded window. ``workers=1`` encodes in the calling process (the tokenizer's own thread pool
then applies, ``TOKENIZERS_PARALLELISM``).

The N records are counted first (a pass over the source: newlines of JSONL files, row counts of the
others). ``part="i/n"`` tokenizes records ``[i * N // n, (i + 1) * N // n)`` into ``dst``; `merge_parts`
(``tbl tokenize --merge PART_0 .. PART_n-1 DST``) joins them in order into a dataset equal to the unsplit
one (the parts' last rows are partial, so merging rewrites the tokens: a sequential copy). A whole run is
itself cut into parts of about ``part_bytes`` of source text, each published in a hidden staging folder
``.DST.tokenize`` beside ``dst`` with a marker once complete; the dataset is written from them at the end
into the staging folder, renamed to ``dst`` (absent, or an empty folder), and the staging folder removed
(with ``overwrite=True`` it is written over the old dataset instead, by tbl-format's replacement rules). A run that was killed (SIGKILL included) and is run again with
the same source, tokenizer and options resumes: the finished parts are kept, not tokenized again (a
changed source or option discards them, and the report says so). Nothing is published at ``dst`` until
every document is written; an existing ``dst`` is replaced only with ``overwrite=True`` (the checks of
`tbl_loader.conversion.images.check_destination`).

A JSON report (``dst + ".report.json"``) records the counts, the skipped records with why, the parts
resumed, timings, documents/s and MB/s of source text.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

import tbl_format

from ..errors import (
    DestinationError,
    JsonLineError,
    SourceError,
    TextFieldMissingError,
    TextFieldTypeError,
    TokenError,
    TokenizerFileError,
    TokenizerUnavailableError,
    WorkerCrashError,
)
from ..tokens import write_tokens
from ..version import __version__
from .images import (
    _default_workers,
    _die_with,
    _sigint_deferred,
    check_destination,
    check_report_path,
    parse_part,
    part_range,
)

__all__ = ["EOS_SPELLINGS", "PIP_TOKENIZE", "TEXT_FORMATS", "TokenizeReport", "merge_parts", "tokenize_corpus"]

PIP_TOKENIZE: Final = 'pip install "tbl-loader[tokenize]"'
TEXT_FORMATS: Final = ("jsonl", "parquet", "hf")
JSONL_SUFFIXES: Final = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
EOS_SPELLINGS: Final = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>")
ON_ERROR: Final = ("fail", "skip")
# A batch: enough records to amortise a round trip to a worker, few enough to keep every worker busy.
BATCH_RECORDS: Final = 512
BATCH_BYTES: Final = 1 << 20
BATCHES_IN_FLIGHT_PER_WORKER: Final = 4
DEFAULT_PART_BYTES: Final = 64 << 20
READ_BLOCK: Final = 16 << 20
MARKER_SCHEMA: Final = "tbl.tokenize-part/1"
_ERRORS: Final = {cls.__name__: cls for cls in (JsonLineError, TextFieldMissingError, TextFieldTypeError)}


# ------------------------------------------------------------------------------------------ the tokenizer


def _tokenizers() -> Any:
    try:
        import tokenizers  # optional: the tokenize extra
    except ImportError as e:
        raise TokenizerUnavailableError(f"tbl tokenize needs the HuggingFace tokenizers library: {PIP_TOKENIZE}") from e
    return tokenizers


@dataclass(frozen=True)
class _TokenizerSpec:
    """What every worker loads: the tokenizer file's text as the parent read it (a file changed during the
    run cannot make workers disagree), and the settings recorded in the metadata."""

    text: str
    sha256: str
    eos: int
    eos_source: str
    vocab_size: int


def load_tokenizer(path: str | os.PathLike[str], eos: int | None) -> _TokenizerSpec:
    """Read and check the tokenizer file; the eos id to append (given, or the tokenizer's own)."""
    tk = _tokenizers()
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TokenizerFileError(f"tokenizer {str(path)!r}: {e.strerror or e}") from e
    try:
        tokenizer = tk.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the library raises its own Exception subclass for a bad file
        raise TokenizerFileError(f"tokenizer {str(path)!r} does not load as a tokenizers file: {e}") from e
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        raise TokenizerFileError(
            f"tokenizer {str(path)!r} pads or truncates what it encodes; a corpus is stored whole: save it "
            "after no_padding() and no_truncation()")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if eos is not None:
        if isinstance(eos, bool) or not isinstance(eos, (int, np.integer)) or eos < 0:
            raise TokenizerFileError(f"eos must be a token id >= 0, got {eos!r}")
        source = "given"
    else:
        eos, source = _own_eos(path, tokenizer)
    return _TokenizerSpec(raw.decode("utf-8"), hashlib.sha256(raw).hexdigest(), int(eos), source, vocab)


def _own_eos(path: Path, tokenizer: Any) -> tuple[int, str]:
    config = path.with_name("tokenizer_config.json")
    if config.is_file():
        try:
            value = json.loads(config.read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError) as e:
            raise TokenizerFileError(f"{str(config)!r} is not a readable tokenizer config: {e}") from e
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            token_id = tokenizer.token_to_id(value)
            if token_id is None:
                raise TokenizerFileError(f"{str(config)!r} names eos_token {value!r}, which the tokenizer lacks")
            return token_id, f"eos_token {value!r} of {config.name}"
    special = {t.content: k for k, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    found = [s for s in EOS_SPELLINGS if s in special]
    if len(found) != 1:
        what = "none" if not found else f"several ({', '.join(found)})"
        raise TokenizerFileError(
            f"tokenizer {str(path)!r} names no end-of-document token ({what} of the special tokens "
            f"{list(EOS_SPELLINGS)}, no tokenizer_config.json eos_token beside it); pass --eos ID (eos=ID)")
    return special[found[0]], f"special token {found[0]!r}"


# ------------------------------------------------------------------------------------------ the source


@dataclass(frozen=True)
class _Source:
    kind: str
    root: Path
    files: tuple[Path, ...]  # jsonl / parquet files in order; hf: the folder
    counts: tuple[int, ...]  # records per file
    text_bytes: int  # uncompressed bytes of the records (JSONL lines; the text column's data otherwise)
    ignored: int

    @property
    def records(self) -> int:
        return sum(self.counts)

    def identity(self) -> list[list[Any]]:
        """Each file with its size and modification time: a resumed run's parts must come from the same bytes."""
        paths = self.files if self.kind != "hf" else sorted(p for p in self.root.iterdir() if p.is_file())
        out = []
        for p in paths:
            st = p.stat()
            out.append([str(p), st.st_size, st.st_mtime_ns])
        return out


def _is_jsonl(name: str) -> bool:
    return name.lower().endswith(JSONL_SUFFIXES)


def detect_text_format(src: Path) -> str:
    if src.is_dir():
        if (src / "state.json").is_file() or (src / "dataset_dict.json").is_file():
            return "hf"
        names = [e.name for e in os.scandir(src) if e.is_file() and not e.name.startswith(".")]
        if any(n.lower().endswith(".parquet") for n in names) and not any(_is_jsonl(n) for n in names):
            return "parquet"
        return "jsonl"
    return "parquet" if src.name.lower().endswith(".parquet") else "jsonl"


def _open_binary(path: Path) -> Any:
    """The decompressed bytes of a JSONL file, as a binary file object."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        try:
            import zstandard  # optional: the tokenize extra
        except ImportError as e:
            raise TokenizerUnavailableError(f"{str(path)!r}: .zst sources need zstandard: {PIP_TOKENIZE}") from e
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a corrupt compressed stream raises (gzip: OSError / EOFError; zstandard: its own ZstdError)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


def _count_lines(path: Path) -> tuple[int, int]:
    """(records, bytes) of a JSONL file: its newlines, plus a last line without one."""
    lines = size = 0
    last = b"\n"
    try:
        with _open_binary(path) as f:
            while block := f.read(READ_BLOCK):
                lines += block.count(b"\n")
                size += len(block)
                last = block[-1:]
    except _read_errors() as e:
        if isinstance(e, OSError) and not isinstance(e, (gzip.BadGzipFile, EOFError)) and e.errno is not None:
            raise
        raise SourceError(f"{str(path)!r} does not read as {_compression(path)}: {type(e).__name__}: {e}") from e
    return lines + (last != b"\n"), size


def _compression(path: Path) -> str:
    name = path.name.lower()
    return "gzip" if name.endswith(".gz") else "zstandard" if name.endswith(".zst") else "a file"


def scan_source(src: str | os.PathLike[str], text_field: str, source_format: str | None = None) -> _Source:
    """Find and count the records of ``src`` (see the module docstring); `SourceError` for an unusable one."""
    root = Path(os.path.abspath(src))
    if not root.exists():
        raise SourceError(f"source {os.fspath(src)!r} does not exist")
    if not (root.is_dir() or root.is_file()):
        raise SourceError(f"source {os.fspath(src)!r} is not a regular file or a folder")
    if source_format is not None and source_format not in TEXT_FORMATS:
        raise ValueError(f"source format must be one of {TEXT_FORMATS}, got {source_format!r}")
    kind = source_format or detect_text_format(root)
    if kind == "hf":
        return _scan_hf(root, text_field)
    suffix_ok = (lambda n: n.lower().endswith(".parquet")) if kind == "parquet" else _is_jsonl
    if root.is_dir():
        entries = sorted(e.name for e in os.scandir(root) if not e.name.startswith("."))
        files = [root / n for n in entries if suffix_ok(n) and (root / n).is_file()]
        ignored = len(entries) - len(files)
        if not files:
            raise SourceError(f"source folder {os.fspath(src)!r} holds no {kind} file")
    else:
        files, ignored = [root], 0
    if kind == "parquet":
        counts, size = _count_parquet(files, text_field)
    else:
        counted = [_count_lines(p) for p in files]
        counts, size = [c for c, _ in counted], sum(b for _, b in counted)
    return _Source(kind, root, tuple(files), tuple(counts), size, ignored)


def _pyarrow_parquet() -> Any:
    from .tables import PIP_PARQUET

    try:
        import pyarrow.parquet as pq  # optional: the parquet extra
    except ImportError as e:
        raise ImportError(f"Parquet sources need pyarrow: {PIP_PARQUET}") from e
    return pq


def _check_text_column(schema: Any, text_field: str, where: str) -> None:
    import pyarrow as pa

    if text_field not in schema.names:
        raise TextFieldMissingError(where, f"no column {text_field!r} (columns: {schema.names})")
    t = schema.field(text_field).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise TextFieldTypeError(where, f"column {text_field!r} is {t}, not a string column")


def _count_parquet(files: list[Path], text_field: str) -> tuple[list[int], int]:
    pq = _pyarrow_parquet()
    import pyarrow as pa

    counts, size = [], 0
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"{str(path)!r} is not a readable Parquet file: {e}") from e
        with meta:
            _check_text_column(meta.schema_arrow, text_field, str(path))
            counts.append(meta.metadata.num_rows)
            column = meta.schema_arrow.get_field_index(text_field)
            for g in range(meta.num_row_groups):  # the column's uncompressed size: what MB/s counts
                size += meta.metadata.row_group(g).column(column).total_uncompressed_size
    return counts, size


def _scan_hf(root: Path, text_field: str) -> _Source:
    from .tables import load_dataset

    ds = load_dataset(root)
    import pyarrow.compute as pc

    schema = ds.data.schema
    _check_text_column(schema, text_field, str(root))
    column = ds.data.column(text_field)
    size = int(pc.sum(pc.binary_length(column)).as_py() or 0) if len(ds) else 0
    return _Source("hf", root, (root,), (len(ds),), size, 0)


@dataclass
class _Batch:
    """Records ``first .. first + len(items) - 1`` of the source, all of part ``part`` and of one file: raw
    JSONL lines (``text=False``) or text values. Record k is named ``where.format(label=label, n=number + k)``
    (a JSONL line number, a Parquet or `datasets` row number)."""

    part: int
    first: int
    items: list[Any]
    text: bool
    label: str
    number: int
    where: str

    def name(self, k: int) -> str:
        return self.where.format(label=self.label, n=self.number + k)


# (record index, item, is a text value, label, number, where-format, bytes) of each record, from a reader
_Record = tuple[int, Any, bool, str, int, str, int]


def _batches(source: _Source, todo: Sequence[tuple[int, int, int]], text_field: str) -> Iterator[_Batch]:
    """The records of the ranges ``todo`` ((part, start, stop), increasing), in order, in batches; records
    between them are read past (one sequential pass: a compressed stream is never decompressed twice)."""
    if not todo:
        return
    reader = {"jsonl": _jsonl_records, "parquet": _parquet_records, "hf": _hf_records}[source.kind]
    ranges = iter(todo)
    part, start, stop = next(ranges)
    batch: _Batch | None = None
    batch_bytes = 0
    for index, item, text, label, number, where, size in reader(source, text_field, todo[0][1], todo[-1][2]):
        while index >= stop:
            if batch is not None:
                yield batch
                batch = None
            nxt = next(ranges, None)
            if nxt is None:
                return
            part, start, stop = nxt
        if index < start:
            continue
        if batch is not None and (batch.label != label or len(batch.items) >= BATCH_RECORDS
                                  or batch_bytes >= BATCH_BYTES):
            yield batch
            batch = None
        if batch is None:
            batch = _Batch(part, index, [], text, label, number, where)
            batch_bytes = 0
        batch.items.append(item)
        batch_bytes += size
    if batch is not None:
        yield batch


def _jsonl_records(source: _Source, text_field: str, first: int, stop: int) -> Iterator[_Record]:
    index = 0
    for path in source.files:
        label = str(path)
        try:
            with _open_binary(path) as raw:
                f = raw if hasattr(raw, "readline") and hasattr(raw, "peek") else io.BufferedReader(raw, READ_BLOCK)
                for line_no, line in enumerate(f, start=1):
                    if index >= stop:
                        return
                    yield index, line, False, label, line_no, "{label}:{n}", len(line)
                    index += 1
        except _read_errors() as e:
            if isinstance(e, OSError) and not isinstance(e, (gzip.BadGzipFile, EOFError)) and e.errno is not None:
                raise
            raise SourceError(f"{label!r} does not read as {_compression(path)}: {type(e).__name__}: {e}") from e


def _parquet_records(source: _Source, text_field: str, first: int, stop: int) -> Iterator[_Record]:
    pq = _pyarrow_parquet()
    index = 0
    for path in source.files:
        with pq.ParquetFile(path) as pf:
            _check_text_column(pf.schema_arrow, text_field, str(path))
            row = 0
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if index >= stop:
                    return
                if index + n > first:  # a row group wholly before the ranges is not read
                    column = pf.read_row_group(g, columns=[text_field]).column(0)
                    for k, value in enumerate(column.to_pylist()):
                        yield index + k, value, True, str(path), row + k, "{label}:row {n}", 0
                index, row = index + n, row + n


def _hf_records(source: _Source, text_field: str, first: int, stop: int) -> Iterator[_Record]:
    from .tables import HF_BATCH_ROWS, load_dataset

    arrow = load_dataset(source.root).with_format("arrow")
    for at in range(first, min(stop, source.records), HF_BATCH_ROWS):  # rows are read where they are
        column = arrow[at : min(at + HF_BATCH_ROWS, stop)].column(text_field)
        for k, value in enumerate(column.to_pylist()):
            yield at + k, value, True, "", at + k, "row {n}", 0


# ------------------------------------------------------------------------------------------ workers


@dataclass
class _Encoded:
    """A batch's documents: ``flat`` their ids concatenated, ``lengths`` per record (-1: a bad record),
    ``bad`` (record offset in the batch, error class name, where, reason), ``size`` the bytes read."""

    part: int
    first: int
    flat: np.ndarray
    lengths: np.ndarray
    bad: list[tuple[int, str, str, str]]
    size: int


class _Encoder:
    def __init__(self, spec: _TokenizerSpec, text_field: str) -> None:
        self.tokenizer = _tokenizers().Tokenizer.from_str(spec.text)
        self.field = text_field

    def encode(self, batch: _Batch) -> _Encoded:
        texts: list[str] = []
        good: list[int] = []
        bad: list[tuple[int, str, str, str]] = []
        size = 0
        for k, item in enumerate(batch.items):
            if batch.text:
                text, error = self._from_value(item)
            else:
                size += len(item)
                text, error = self._from_line(item)
            if error is not None:
                bad.append((k, error[0], batch.name(k), error[1]))
                continue
            assert text is not None
            if batch.text:
                size += len(text.encode("utf-8"))
            texts.append(text)
            good.append(k)
        encodings = self.tokenizer.encode_batch(texts) if texts else []
        ids = [e.ids for e in encodings]
        lengths = np.full(len(batch.items), -1, np.int64)
        lengths[good] = [len(x) for x in ids]
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.uint32, int(lengths[good].sum()))
        return _Encoded(batch.part, batch.first, flat, lengths, bad, size)

    def _from_line(self, line: bytes) -> tuple[str | None, tuple[str, str] | None]:
        if not line.strip():
            return None, ("JsonLineError", "an empty line, not a JSON record")
        try:
            record = json.loads(line)
        except UnicodeDecodeError as e:
            return None, ("JsonLineError", f"not UTF-8 ({e.reason} at byte {e.start})")
        except ValueError as e:
            return None, ("JsonLineError", f"not JSON ({e})")
        if not isinstance(record, dict):
            return None, ("TextFieldMissingError", f"a JSON {type(record).__name__}, not an object with "
                                                   f"field {self.field!r}")
        if self.field not in record:
            return None, ("TextFieldMissingError", f"no field {self.field!r} (fields: {sorted(record)[:10]})")
        return self._from_value(record[self.field])

    def _from_value(self, value: Any) -> tuple[str | None, tuple[str, str] | None]:
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            return None, ("TextFieldTypeError", f"field {self.field!r} is {kind}, not a string")
        return value, None


_WORKER: _Encoder | None = None


def _init_worker(parent_pid: int, spec: _TokenizerSpec, text_field: str) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to act on (it stops the pool)
    _die_with(parent_pid)
    # One thread per worker process: the processes are the parallelism (no oversubscribed thread pools).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = _Encoder(spec, text_field)


def _worker_encode(batch: _Batch) -> _Encoded:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.encode(batch)


def _mp_context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _encoded_in_order(batches: Iterator[_Batch], spec: _TokenizerSpec, text_field: str,
                      workers: int) -> Iterator[_Encoded]:
    if workers == 1:
        encoder = _Encoder(spec, text_field)
        for batch in batches:
            yield encoder.encode(batch)
        return
    pool: ProcessPoolExecutor | None = None
    pending: deque[tuple[_Batch, Future[_Encoded]]] = deque()

    def submit_next() -> None:
        assert pool is not None
        batch = next(batches, None)
        if batch is not None:
            pending.append((batch, pool.submit(_worker_encode, batch)))

    current: _Batch | None = None
    try:
        with _sigint_deferred():
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context(), initializer=_init_worker,
                                       initargs=(os.getpid(), spec, text_field))
            for _ in range(workers * BATCHES_IN_FLIGHT_PER_WORKER):
                submit_next()
        while pending:
            current, future = pending.popleft()
            result = future.result()
            submit_next()
            yield result
    except BrokenProcessPool as e:
        first = current.first if current is not None else 0
        raise WorkerCrashError(
            f"a worker process died with records from {first} in flight (killed, out of memory; a script that "
            "calls tokenize_corpus() with workers > 1 needs an `if __name__ == '__main__':` guard); nothing was "
            "published. workers=1 tokenizes in this process") from e
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------ the run


@dataclass
class TokenizeReport:
    """What a tokenize run did (also written as ``DST.report.json``)."""

    source: str
    destination: str
    status: str
    format: str
    tokenizer: str
    tokenizer_sha256: str
    text_field: str
    eos: int
    eos_source: str
    dtype: str
    workers: int
    part: tuple[int, int] | None
    part_range: tuple[int, int]
    source_documents: int
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored_files: int = 0
    parts: int = 1
    parts_resumed: int = 0
    resumed_documents: int = 0  # of ``documents``: in parts an earlier run finished (not in the rates)
    resumed_bytes: int = 0
    resume_note: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    documents_per_s: float = 0.0
    mb_per_s: float = 0.0
    error: str | None = None
    report_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [f"tokenized {self.documents:,} of {self.part_range[1] - self.part_range[0]:,} records -> "
                 f"{self.destination}: {self.tokens:,} tokens ({self.dtype}, eos {self.eos}), "
                 f"{self.documents_per_s:,.0f} documents/s, {self.mb_per_s:,.2f} MB/s"]
        if self.parts_resumed:
            lines.append(f"resumed {self.parts_resumed} of {self.parts} finished part(s)")
        if self.resume_note:
            lines.append(self.resume_note)
        if self.skipped:
            lines.append(f"{len(self.skipped)} record(s) skipped:")
            lines += [f"  {s['where']}: {s['error']}: {s['reason']}" for s in self.skipped[:20]]
        return "\n".join(lines)


def tokenize_corpus(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str],
    text_field: str = "text",
    eos: int | None = None,
    workers: int | None = None,
    part: str | tuple[int, int] | None = None,
    on_error: str = "fail",
    source_format: str | None = None,
    dtype: str | None = None,
    chunk: int = 65536,
    shard_tokens: int = 1 << 26,
    part_bytes: int = DEFAULT_PART_BYTES,
    overwrite: bool = False,
    report: str | os.PathLike[str] | bool | None = None,
) -> TokenizeReport:
    """Tokenize the corpus ``src`` into the token dataset folder ``dst`` (the module docstring says how).

    Args:
        src: a JSONL(.gz / .zst) file or folder, a Parquet file or folder, a `datasets` save_to_disk folder.
        dst: the dataset folder to publish.
        tokenizer: a ``tokenizer.json`` of the ``tokenizers`` library.
        text_field: the field (JSON key, column) holding each document's text.
        eos: the id appended after every document; None: the tokenizer's own (refused when it has none).
        workers: worker processes (default: every usable core).
        part: ``"i/n"`` or ``(i, n)``: only that contiguous part of the records (join with `merge_parts`).
        on_error: ``"fail"`` (raise the first bad record's error) or ``"skip"`` (leave it out, list it).
        source_format: one of ``TEXT_FORMATS``; None detects it.
        dtype: the stored dtype (default: ``uint16`` when every id fits, else ``uint32``).
        chunk: tokens per row (`write_tokens`).
        shard_tokens: tokens per shard file (`write_tokens`).
        part_bytes: source bytes per resumable part of a whole run.
        overwrite: replace an existing dataset at ``dst``.
        report: the report path; None: ``dst + ".report.json"``; False: none.
    """
    t0 = time.perf_counter()
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    workers = _default_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"part_bytes must be a positive int, got {part_bytes!r}")
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"text_field must be a non-empty string, got {text_field!r}")
    part_t = parse_part(part)
    spec = load_tokenizer(tokenizer, eos)
    top = max(spec.vocab_size - 1, spec.eos)
    dtype = dtype or ("uint16" if top <= np.iinfo(np.uint16).max else "uint32")
    if dtype not in ("uint16", "uint32", "uint64") or top > np.iinfo(np.dtype(dtype)).max:
        raise TokenError(f"dtype {dtype!r} cannot hold the tokenizer's ids (up to {top})")
    dst_path = Path(dst)
    report_path = Path(f"{dst_path}.report.json") if report is None or report is True else (
        None if report is False else Path(report))
    check_destination(dst_path, sharded=True, overwrite=overwrite, inputs=[Path(src), Path(tokenizer)])
    if report_path is not None:  # never over the source, the tokenizer, DST, or a file that is not a report
        check_report_path(report_path, [Path(src), Path(tokenizer), dst_path])
    source = scan_source(src, text_field, source_format)
    n_all = source.records
    if n_all == 0:
        raise SourceError(f"source {os.fspath(src)!r} holds no record")
    start, stop = part_range(n_all, part_t)
    if part_t is not None and start == stop:
        raise SourceError(f"part {part_t[0]}/{part_t[1]} of {n_all} records holds none; use fewer parts")
    metadata = {"tokenize": {"tokenizer_sha256": spec.sha256, "text_field": text_field, "eos": spec.eos,
                             "eos_source": spec.eos_source, "add_special_tokens": True,
                             "tokenizers": _tokenizers().__version__, "converter": f"tbl-loader {__version__}"}}
    rep = TokenizeReport(
        source=os.fspath(src), destination=str(dst_path), status="failed", format=source.kind,
        tokenizer=os.fspath(tokenizer), tokenizer_sha256=spec.sha256, text_field=text_field, eos=spec.eos,
        eos_source=spec.eos_source, dtype=dtype, workers=workers, part=part_t, part_range=(start, stop),
        source_documents=n_all, ignored_files=source.ignored)
    write_options = {"dtype": dtype, "eos": spec.eos, "chunk": chunk, "shard_tokens": shard_tokens,
                     "metadata": metadata}
    try:
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        t_scan = time.perf_counter()
        if part_t is not None:
            ranges = [(start, stop)]
        else:
            count = max(1, min(n_all, math.ceil(source.text_bytes / part_bytes)))
            ranges = [part_range(n_all, (i, count)) for i in range(count)]
        rep.parts = len(ranges)
        workers = rep.workers = max(1, min(workers, stop - start))
        _run_staged(source, ranges, spec, text_field, workers, dst_path, write_options, on_error, rep, overwrite)
    except BaseException as e:
        rep.error = f"{type(e).__name__}: {e}"
        _finish(rep, t0, report_path)
        if rep.report_error is not None:
            e.add_note(rep.report_error)
        raise
    rep.status = "ok"
    rep.timings["scan_s"] = t_scan - t0
    _finish(rep, t0, report_path)
    return rep


def _finish(rep: TokenizeReport, t0: float, report_path: Path | None) -> None:
    total = time.perf_counter() - t0
    rep.timings["total_s"] = total
    if total > 0:  # this run's work: parts an earlier run finished are not counted
        rep.documents_per_s = (rep.documents - rep.resumed_documents) / total
        rep.mb_per_s = (rep.bytes - rep.resumed_bytes) / total / 1e6
    if report_path is not None:
        try:
            _write_json(report_path, rep.to_json())
        except OSError as e:  # the dataset stands: the report's failure is told, not raised
            rep.report_error = f"the report {report_path} could not be written: {e.strerror or e}"


def _write_json(path: Path, value: Any) -> None:
    """Atomic (temp + rename): a reader never sees half of it, a killed run leaves none of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(value, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_part(results: Iterator[_Encoded], part: int, dst: Path, options: dict[str, Any], on_error: str,
                rep: TokenizeReport, overwrite: bool) -> dict[str, Any]:
    """Write the documents of ``results`` (all of part ``part``) as a token dataset at ``dst``; its counts.

    Returns ``{"documents", "tokens", "bytes", "skipped"}``; with no document left (every record skipped),
    nothing is written.
    """
    counts: dict[str, Any] = {"documents": 0, "tokens": 0, "bytes": 0, "skipped": []}

    def documents() -> Iterator[np.ndarray]:
        for enc in results:
            assert enc.part == part
            counts["bytes"] += enc.size
            for _, name, where, reason in enc.bad:
                if on_error == "fail":
                    raise _ERRORS[name](where, reason)
                counts["skipped"].append({"where": where, "error": name, "reason": reason})
            ends = np.cumsum(np.maximum(enc.lengths, 0))
            for k, n in enumerate(enc.lengths.tolist()):
                if n >= 0:
                    counts["documents"] += 1
                    counts["tokens"] += n + 1
                    yield enc.flat[ends[k] - n : ends[k]]

    docs = documents()
    first = next(docs, None)
    if first is None:
        for _ in docs:  # (drained: the counts and skipped records are complete)
            pass
    else:
        write_tokens(itertools.chain([first], docs), dst, overwrite=overwrite, **options)
    rep.documents += counts["documents"]
    rep.tokens += counts["tokens"]
    rep.bytes += counts["bytes"]
    rep.skipped += counts["skipped"]
    return counts


def _staging(dst: Path, what: str) -> Path:
    """The hidden folder beside ``dst`` where a run (``tokenize``) or a merge (``merge``) prepares it."""
    return dst.parent / f".{dst.name}.{what}"


def _rename_into(final: Path, dst: Path) -> None:
    """Publish the complete dataset folder ``final`` at ``dst`` (absent, or an empty folder: check_destination)."""
    if dst.is_dir():
        dst.rmdir()
    os.rename(final, dst)


def _run_staged(source: _Source, ranges: list[tuple[int, int]], spec: _TokenizerSpec, text_field: str,
                workers: int, dst: Path, options: dict[str, Any], on_error: str, rep: TokenizeReport,
                overwrite: bool) -> None:
    """The run in resumable parts under the staging folder, then ``dst`` published from them.

    One part is written as the dataset itself; several are joined into it (`_rewrite`). Without ``overwrite``
    the dataset is completed inside the staging folder and renamed to ``dst`` (absent or an empty folder):
    a run killed at any point leaves nothing at ``dst``. With ``overwrite`` it is written over the old dataset
    by `write_tokens` (tbl-format's replacement rules).
    """
    staging = _staging(dst, "tokenize")
    plan = {"schema": "tbl.tokenize-plan/1", "source": source.identity(), "format": source.kind,
            "tokenizer_sha256": spec.sha256, "text_field": text_field, "on_error": on_error,
            "options": dict(options), "ranges": ranges}
    done = _resume(staging, plan, rep)
    staging.mkdir(exist_ok=True)
    try:
        _write_json(staging / "plan.json", plan)
        final = dst if overwrite else staging / "dataset"
        if not overwrite:
            shutil.rmtree(final, ignore_errors=True)  # the unfinished dataset of a killed run: written again
        folders = _run_parts(source, ranges, spec, text_field, workers, staging, done, options, on_error, rep,
                             single=final if len(ranges) == 1 else None, overwrite=overwrite)
        if not folders:
            raise TokenError(f"no document to write: all {len(rep.skipped)} record(s) were skipped")
        if len(ranges) > 1:
            _rewrite(folders, final, options, overwrite)
        if not overwrite:
            _rename_into(final, dst)
    except BaseException:
        if not any(staging.glob("part-*.json")):  # nothing a rerun could resume: leave nothing behind
            shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging)


def _run_parts(source: _Source, ranges: list[tuple[int, int]], spec: _TokenizerSpec, text_field: str,
               workers: int, staging: Path, done: dict[int, dict[str, Any]], options: dict[str, Any],
               on_error: str, rep: TokenizeReport, *, single: Path | None, overwrite: bool) -> list[Path]:
    """Tokenize the parts not ``done``, each published with its marker; every part's folder, in order.

    ``single``: the only part is written there (the dataset itself; no marker: nothing is left to resume).
    """
    todo = [(i, a, b) for i, (a, b) in enumerate(ranges) if i not in done]
    rep.parts_resumed = len(done)
    for counts in done.values():
        for key in ("documents", "tokens", "bytes"):
            setattr(rep, key, getattr(rep, key) + counts[key])
        rep.resumed_documents += counts["documents"]
        rep.resumed_bytes += counts["bytes"]
    skipped = {i: counts["skipped"] for i, counts in done.items()}
    written = {i for i, counts in done.items() if counts["documents"]}
    results = _encoded_in_order(_batches(source, todo, text_field), spec, text_field, workers)
    with closing(results):  # on an error the pool stops now, not when the traceback is dropped
        grouped = itertools.groupby(results, key=lambda enc: enc.part)
        pending = next(grouped, None)
        for i, _, _ in todo:
            group: Iterator[_Encoded] = iter(())
            if pending is not None and pending[0] == i:
                group = pending[1]
            folder = single if single is not None else staging / f"part-{i:05d}"
            if single is None:
                shutil.rmtree(folder, ignore_errors=True)  # a part a killed run left unfinished: written again
            counts = _write_part(group, i, folder, options, on_error, rep, overwrite and single is not None)
            for _ in group:  # (a part is consumed whole before the next one's group is asked for)
                pass
            skipped[i] = counts["skipped"]
            if counts["documents"]:
                written.add(i)
            if single is None:
                _write_json(staging / f"part-{i:05d}.json", {"schema": MARKER_SCHEMA, **counts})
            if pending is not None and pending[0] == i:
                pending = next(grouped, None)
    rep.skipped = [s for i in sorted(skipped) for s in skipped[i]]
    if single is not None:
        return [single] if written else []
    return [staging / f"part-{i:05d}" for i in sorted(written)]


def _resume(staging: Path, plan: dict[str, Any], rep: TokenizeReport) -> dict[int, dict[str, Any]]:
    """The finished parts of an earlier run of the same plan ({part: its counts}); another plan's are removed."""
    if not os.path.lexists(staging):
        return {}
    if staging.is_symlink() or not staging.is_dir() or not (staging / "plan.json").is_file():
        raise DestinationError(f"{staging} exists and is not the staging folder of a tbl tokenize run; it is "
                               "never removed: move it away")
    try:
        old = json.loads((staging / "plan.json").read_text())
    except (OSError, ValueError):
        old = None
    if old != json.loads(json.dumps(plan)):
        rep.resume_note = (f"the parts in {staging} came from another source, tokenizer or options: "
                           "discarded, every part tokenized again")
        shutil.rmtree(staging)
        return {}
    done = {}
    for i in range(len(plan["ranges"])):
        marker = staging / f"part-{i:05d}.json"
        if marker.is_file():
            try:
                counts = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue
            if counts.get("schema") == MARKER_SCHEMA:
                done[i] = counts
    return done


# ------------------------------------------------------------------------------------------ merging


def part_documents(path: str | os.PathLike[str]) -> Iterator[np.ndarray]:
    """Every document of the token dataset ``path`` in order, its trailing eos removed (one shard read at a
    time; a document that crosses shards is joined)."""
    ds = tbl_format.open(path)
    try:
        chunk = int(ds.metadata["tokens"]["chunk"])
        carry: list[np.ndarray] = []  # the pieces of the document still open at the end of a shard
        for k, rows in enumerate(ds.segment_rows):
            if not rows:
                continue
            shard = ds.shard(k)
            used = (rows - 1) * chunk + int(np.asarray(shard.column("length"))[-1])
            flat = np.asarray(shard.column("tokens")).reshape(-1)[:used]
            starts = [r * chunk + s for r, row in enumerate(shard.values("starts", list(range(rows)))) for s in row]
            bounds = [*starts, used]
            if bounds[0] > 0:
                carry.append(flat[: bounds[0]].copy())
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                if carry:  # a document starts: the open one is complete
                    yield np.concatenate(carry)[:-1]
                carry = [flat[a:b].copy()]
        if carry:
            yield np.concatenate(carry)[:-1]
    finally:
        ds.close()


def _rewrite(parts: Sequence[Path], dst: Path, options: dict[str, Any], overwrite: bool) -> None:
    documents = itertools.chain.from_iterable(part_documents(p) for p in parts)
    write_tokens(documents, dst, overwrite=overwrite, **options)


def merge_parts(parts: Sequence[str | os.PathLike[str]], dst: str | os.PathLike[str], *,
                overwrite: bool = False) -> Path:
    """Join the outputs of ``tokenize_corpus(..., part="i/n")`` for i = 0..n-1, given in that order, into ``dst``.

    The parts must share their tokens settings and ``tokenize`` metadata (one tokenizer, field, eos); when
    each part's default report (``PART.report.json``) is there, they must be parts 0..n-1 of one source in
    order, none missing (`TokenError` otherwise). Tokens are copied (a part's last row is partial), so the
    result equals the unsplit run's dataset.
    """
    if not parts:
        raise TokenError("merge needs at least one part")
    dst_path = Path(dst)
    check_destination(dst_path, sharded=True, overwrite=overwrite, inputs=[Path(p) for p in parts])
    infos = []
    for p in parts:
        try:
            ds = tbl_format.open(p)
        except (tbl_format.FormatError, OSError, ValueError) as e:
            raise TokenError(f"part {os.fspath(p)!r} does not open as a dataset: {e}") from e
        try:
            meta = ds.metadata
        finally:
            ds.close()
        if "tokenize" not in meta or "tokens" not in meta:
            raise TokenError(f"part {os.fspath(p)!r} is not a tbl tokenize output")
        infos.append(meta)
    for p, meta in zip(parts[1:], infos[1:], strict=True):
        if meta != infos[0]:
            raise TokenError(f"part {os.fspath(p)!r}: its tokens settings or tokenizer differ from "
                             f"{os.fspath(parts[0])!r}'s")
    _check_part_reports(parts)
    tokens = infos[0]["tokens"]
    options = {"dtype": tokens["dtype"], "eos": tokens["eos"], "chunk": tokens["chunk"],
               "shard_tokens": _shard_tokens(parts[0], tokens["chunk"]),
               "metadata": {k: v for k, v in infos[0].items() if k != "tokens"}}
    if overwrite:  # over the old dataset, by tbl-format's replacement rules
        _rewrite([Path(p) for p in parts], dst_path, options, True)
        return dst_path
    # Written complete in a hidden folder, then renamed: a killed merge leaves nothing at dst.
    staging = _staging(dst_path, "merge")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _rewrite([Path(p) for p in parts], staging, options, False)
        _rename_into(staging, dst_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dst_path


def _shard_tokens(path: str | os.PathLike[str], chunk: int) -> int:
    ds = tbl_format.open(path)
    try:
        return max(ds.segment_rows) * chunk
    finally:
        ds.close()


def _check_part_reports(parts: Sequence[str | os.PathLike[str]]) -> None:
    reports = []
    for p in parts:
        path = Path(f"{os.fspath(p)}.report.json")
        if not path.is_file():
            return  # reports are optional: moved parts are merged on the caller's word
        try:
            reports.append(json.loads(path.read_text()))
        except ValueError as e:
            raise TokenError(f"report {str(path)!r} of part {os.fspath(p)!r} is not JSON: {e}") from e
    expected = 0
    for k, (p, rep) in enumerate(zip(parts, reports, strict=True)):
        if rep.get("status") != "ok" or rep.get("part") is None:
            raise TokenError(f"part {os.fspath(p)!r}: its report is not a successful --part run")
        if rep["part"] != [k, len(parts)]:
            raise TokenError(f"part {os.fspath(p)!r} is part {rep['part'][0]}/{rep['part'][1]} but was given at "
                             f"position {k} of {len(parts)}; give parts 0..n-1 in order")
        if rep["part_range"][0] != expected or rep.get("source_documents") != reports[0].get("source_documents"):
            raise TokenError(f"part {os.fspath(p)!r}: its range {rep['part_range']} does not continue the "
                             "previous part")
        expected = rep["part_range"][1]
    if expected != reports[0].get("source_documents"):
        raise TokenError(f"the parts cover {expected} of {reports[0].get('source_documents')} source records")
