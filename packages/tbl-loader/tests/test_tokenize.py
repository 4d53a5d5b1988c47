"""tbl tokenize: every document's tokens against the tokenizers library's own encode_batch, from every source
kind; workers 1 vs 2, parts + merge and a killed-then-rerun run give the same dataset; hostile input is named.

The tokenizer is a tiny byte-level BPE trained here (nothing is downloaded). The stored dataset is read back
with plain numpy over tbl_format (the rows flattened, the document index), not with the code under test.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tbl_format
from tbl_loader import TokenLoader
from tbl_loader.conversion.tokenize import merge_parts, tokenize_corpus
from tbl_loader.errors import (
    DestinationError,
    JsonLineError,
    SourceError,
    TextFieldMissingError,
    TextFieldTypeError,
    TokenizerFileError,
    TokenizerUnavailableError,
)

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["alpha", "beta", "gamma", "delta", "tokens", "stream", "über", "日本語", "document", "the", "a", "of",
         "naïve", "😀", "end.", "\n"]
EOS = 1  # "</s>" is the second special token of the trained vocabulary


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(WORDS[k] for k in rng.integers(0, len(WORDS), int(rng.integers(0, 80)))) for _ in range(n)]
    texts[3] = ""  # an empty text is a document of its eos alone
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("corpus")
    texts = make_texts(600)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(root / "tokenizer.json"))
    assert tok.token_to_id("</s>") == EOS
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)).encode()
    (root / "c.jsonl").write_bytes(lines)
    (root / "c.jsonl.gz").write_bytes(gzip.compress(lines))
    zstandard = pytest.importorskip("zstandard")
    (root / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    folder = root / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"".join(lines.splitlines(keepends=True)[:250]))
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(lines.splitlines(keepends=True)[250:])))
    (folder / "README.txt").write_text("not a record file")
    return {"root": root, "texts": texts, "tokenizer": root / "tokenizer.json"}


def expected(corpus: dict, texts: list[str] | None = None) -> list[np.ndarray]:
    tok = tokenizers.Tokenizer.from_file(str(corpus["tokenizer"]))
    return [np.append(np.asarray(e.ids, np.int64), EOS) for e in tok.encode_batch(texts or corpus["texts"])]


def read_documents(path: Path) -> tuple[list[np.ndarray], dict]:
    """The stored documents: every row's used tokens flattened, cut at the document index's starts."""
    ds = tbl_format.open(path)
    try:
        chunk = ds.metadata["tokens"]["chunk"]
        flat, starts, at = [], [], 0
        for row in range(len(ds)):
            sample = ds[row]
            flat.append(np.asarray(sample["tokens"])[: sample["length"]].astype(np.int64))
            starts += [at + s for s in sample["starts"]]
            at += chunk
        meta = ds.metadata
    finally:
        ds.close()
    stream = np.concatenate(flat)
    return np.split(stream, starts[1:]), meta


def assert_documents(path: Path, want: list[np.ndarray]) -> None:
    got, _ = read_documents(path)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), f"document {k}"


def make_parquet(path: Path, texts: list, *, row_group_size: int = 128) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), path, row_group_size=row_group_size)


@pytest.mark.parametrize("source", ["c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "folder", "parquet", "hf"])
def test_every_document_equals_encode_batch(corpus: dict, tmp_path: Path, source: str) -> None:
    if source == "parquet":
        src = tmp_path / "c.parquet"
        make_parquet(src, corpus["texts"])
    elif source == "hf":
        datasets = pytest.importorskip("datasets")
        src = tmp_path / "hf"
        datasets.Dataset.from_dict({"text": corpus["texts"]}).save_to_disk(str(src))
    else:
        src = corpus["root"] / source
    dst = tmp_path / "tok"
    rep = tokenize_corpus(src, dst, tokenizer=corpus["tokenizer"], workers=1)
    want = expected(corpus)
    assert_documents(dst, want)
    assert rep.documents == len(want) and rep.tokens == sum(len(w) for w in want) and rep.status == "ok"
    assert rep.ignored_files == (1 if source == "folder" else 0)
    _, meta = read_documents(dst)
    assert meta["tokens"]["eos"] == EOS and meta["tokens"]["dtype"] == "uint16"
    assert meta["tokenize"]["eos_source"] == "special token '</s>'" and meta["tokenize"]["text_field"] == "text"
    # TokenLoader serves it, windows and document boundaries from the stored index
    flat = np.concatenate(want)
    lm = TokenLoader(dst, 4, 32, shuffle=False, boundaries=True, backend="numpy", dtype="int64")
    batch = next(iter(lm))
    lm.close()
    assert np.array_equal(batch.tokens[1], flat[32:65])
    starts = np.cumsum([0, *[len(w) for w in want]])[:-1]
    doc_of = np.searchsorted(starts, np.arange(32, 64), side="right") - 1
    assert np.array_equal(batch.document_ids[1], doc_of)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the staging folder is gone


def dataset_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_workers_one_and_two_give_the_same_dataset(corpus: dict, tmp_path: Path) -> None:
    src = corpus["root"] / "c.jsonl.gz"
    kwargs = {"tokenizer": corpus["tokenizer"], "part_bytes": 9000, "shard_tokens": 4096, "chunk": 512}
    one = tokenize_corpus(src, tmp_path / "one", workers=1, **kwargs)
    two = tokenize_corpus(src, tmp_path / "two", workers=2, **kwargs)
    assert one.parts == two.parts > 5 and two.workers == 2
    a, b = read_documents(tmp_path / "one"), read_documents(tmp_path / "two")
    assert len(a[0]) == len(b[0]) and all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1]
    assert_documents(tmp_path / "two", expected(corpus))
    # shard for shard the same files (the manifests differ only by the dataset's own id)
    one_ds, two_ds = tbl_format.open(tmp_path / "one"), tbl_format.open(tmp_path / "two")
    assert one_ds.segment_rows == two_ds.segment_rows
    one_ds.close()
    two_ds.close()


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``tbl tokenize ARGS`` in a subprocess; a traceback is a failure."""
    result = subprocess.run([sys.executable, "-m", "tbl_format.cli", "tokenize", *args], capture_output=True,
                            text=True, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_parts_and_merge_equal_a_single_run(corpus: dict, tmp_path: Path) -> None:
    src = str(corpus["root"] / "c.jsonl.zst")
    tok = str(corpus["tokenizer"])
    whole = cli(src, str(tmp_path / "whole"), "--tokenizer", tok, "--workers", "2", "--quiet")
    assert whole.returncode == 0, whole.stderr
    parts = [str(tmp_path / f"p{i}") for i in range(3)]
    r = cli(src, parts[0], "--tokenizer", tok, "--part", "0/3", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    for i in (1, 2):  # the same through the API (each part's report written as the CLI's)
        rep = tokenize_corpus(src, parts[i], tokenizer=tok, part=f"{i}/3", workers=1)
        assert rep.part == (i, 3) and rep.part_range == (i * 600 // 3, (i + 1) * 600 // 3)
    # out of order: refused by the parts' reports, nothing written
    bad = cli("--merge", parts[1], parts[0], parts[2], str(tmp_path / "bad"))
    assert bad.returncode == 2 and "give parts 0..n-1 in order" in bad.stderr and not (tmp_path / "bad").exists()
    merged = cli("--merge", *parts, str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    a, b = read_documents(tmp_path / "whole"), read_documents(tmp_path / "merged")
    assert a[1] == b[1] and len(a[0]) == len(b[0]) == len(corpus["texts"])
    for path in (tmp_path / "whole", tmp_path / "merged"):  # every checksum and the document index's rules
        with tbl_format.open(path) as ds:
            ds.verify()
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    # the API's merge of parts written without reports (moved parts): the caller's order is taken
    for p in parts:
        Path(f"{p}.report.json").unlink()
    merge_parts(parts, tmp_path / "merged2")
    assert all(np.array_equal(x, y) for x, y in zip(a[0], read_documents(tmp_path / "merged2")[0], strict=True))


def test_killed_run_then_rerun_resumes_and_publishes(corpus: dict, tmp_path: Path) -> None:
    texts = make_texts(10_000, seed=1)
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    dst = tmp_path / "tok"
    staging = tmp_path / ".tok.tokenize"
    argv = [sys.executable, "-m", "tbl_format.cli", "tokenize", str(src), str(dst), "--tokenizer",
            str(corpus["tokenizer"]), "--workers", "2", "--part-size", "20k", "--quiet"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (staging / "part-00001.json").exists():  # two parts finished: kill it mid-run
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists()  # nothing published
    finished = len(list(staging.glob("part-*.json")))
    assert finished >= 2
    again = cli(str(src), str(dst), "--tokenizer", str(corpus["tokenizer"]), "--workers", "2", "--part-size", "20k")
    assert again.returncode == 0, again.stderr
    report = json.loads(Path(f"{dst}.report.json").read_text())
    assert report["parts_resumed"] >= finished and report["parts"] > report["parts_resumed"]
    assert f"resumed {report['parts_resumed']} of {report['parts']}" in again.stderr
    assert report["documents"] == len(texts)
    assert_documents(dst, expected(corpus, texts))
    assert not staging.exists()


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"text": "alpha beta"})


@pytest.mark.parametrize(("line", "error", "words"), [
    ('{"text": "alpha", ', JsonLineError, "not JSON"),
    ("", JsonLineError, "empty line"),
    ('{"body": "alpha"}', TextFieldMissingError, "no field 'text'"),
    ('["alpha"]', TextFieldMissingError, "a JSON list"),
    ('{"text": 17}', TextFieldTypeError, "is int, not a string"),
    ('{"text": null}', TextFieldTypeError, "is null"),
])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_record_is_named_with_its_line(corpus: dict, tmp_path: Path, line: str, error: type, words: str,
                                             workers: int) -> None:
    src = write_lines(tmp_path / "bad.jsonl", [GOOD, GOOD, line, GOOD])
    with pytest.raises(error, match=words) as info:
        tokenize_corpus(src, tmp_path / "tok", tokenizer=corpus["tokenizer"], workers=workers)
    assert info.value.where == f"{src}:3"
    assert str(info.value).startswith(f"{src}:3: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "tok.report.json"]  # nothing published
    assert json.loads((tmp_path / "tok.report.json").read_text())["status"] == "failed"


def test_on_error_skip_leaves_bad_records_out_and_lists_them(corpus: dict, tmp_path: Path) -> None:
    src = write_lines(tmp_path / "bad.jsonl", [GOOD, b"\xff\xfe".decode("latin-1"), '{"text": [1]}', GOOD])
    rep = tokenize_corpus(src, tmp_path / "tok", tokenizer=corpus["tokenizer"], workers=1, on_error="skip")
    assert [(s["where"], s["error"]) for s in rep.skipped] == [
        (f"{src}:2", "JsonLineError"), (f"{src}:3", "TextFieldTypeError")]
    assert_documents(tmp_path / "tok", expected(corpus, ["alpha beta", "alpha beta"]))
    r = cli(str(src), str(tmp_path / "tok2"), "--tokenizer", str(corpus["tokenizer"]), "--on-error", "skip")
    assert r.returncode == 1 and f"{src}:3: TextFieldTypeError" in r.stderr  # published, with records left out
    r = cli(str(src), str(tmp_path / "tok3"), "--tokenizer", str(corpus["tokenizer"]))
    assert r.returncode == 3 and "JsonLineError" in r.stderr and f"{src}:2" in r.stderr
    assert not (tmp_path / "tok3").exists()


def test_hostile_tables_and_streams(corpus: dict, tmp_path: Path) -> None:
    tok = corpus["tokenizer"]
    make_parquet(tmp_path / "nums.parquet", [1, 2, 3])
    with pytest.raises(TextFieldTypeError, match="column 'text' is int64"):
        tokenize_corpus(tmp_path / "nums.parquet", tmp_path / "a", tokenizer=tok)
    with pytest.raises(TextFieldMissingError, match="no column 'body'"):
        tokenize_corpus(tmp_path / "nums.parquet", tmp_path / "a", tokenizer=tok, text_field="body")
    make_parquet(tmp_path / "nulls.parquet", ["alpha", None, "beta"], row_group_size=2)
    with pytest.raises(TextFieldTypeError) as info:
        tokenize_corpus(tmp_path / "nulls.parquet", tmp_path / "a", tokenizer=tok)
    assert info.value.where == f"{tmp_path / 'nulls.parquet'}:row 1"
    truncated = gzip.compress((GOOD + "\n").encode() * 1000)[:-40]
    (tmp_path / "cut.jsonl.gz").write_bytes(truncated)
    with pytest.raises(SourceError, match="does not read as gzip"):
        tokenize_corpus(tmp_path / "cut.jsonl.gz", tmp_path / "a", tokenizer=tok)
    with pytest.raises(SourceError, match="does not exist"):
        tokenize_corpus(tmp_path / "missing.jsonl", tmp_path / "a", tokenizer=tok)
    assert not (tmp_path / "a").exists()


def test_eos_given_found_or_refused(corpus: dict, tmp_path: Path) -> None:
    src = write_lines(tmp_path / "c.jsonl", [GOOD])
    rep = tokenize_corpus(src, tmp_path / "given", tokenizer=corpus["tokenizer"], eos=0)
    assert rep.eos == 0 and read_documents(tmp_path / "given")[0][0][-1] == 0
    plain = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    plain.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain.train_from_iterator(["alpha beta"] * 10, tokenizers.trainers.BpeTrainer(vocab_size=300,
                              special_tokens=["<unk>", "<|im_end|>"]))
    folder = tmp_path / "plain"
    folder.mkdir()
    plain.save(str(folder / "tokenizer.json"))
    with pytest.raises(TokenizerFileError, match="no end-of-document token"):
        tokenize_corpus(src, tmp_path / "none", tokenizer=folder / "tokenizer.json")
    r = cli(str(src), str(tmp_path / "none"), "--tokenizer", str(folder / "tokenizer.json"))
    assert r.returncode == 2 and "--eos ID" in r.stderr and not (tmp_path / "none").exists()
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    rep = tokenize_corpus(src, tmp_path / "config", tokenizer=folder / "tokenizer.json")
    assert rep.eos == 1 and rep.eos_source == "eos_token '<|im_end|>' of tokenizer_config.json"
    padded = tokenizers.Tokenizer.from_file(str(corpus["tokenizer"]))
    padded.enable_truncation(8)
    padded.save(str(tmp_path / "truncating.json"))
    with pytest.raises(TokenizerFileError, match="pads or truncates"):
        tokenize_corpus(src, tmp_path / "t", tokenizer=tmp_path / "truncating.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(TokenizerFileError, match="does not load"):
        tokenize_corpus(src, tmp_path / "t", tokenizer=tmp_path / "junk.json")


def test_missing_library_names_the_extra(corpus: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now raises ImportError
    src = write_lines(tmp_path / "c.jsonl", [GOOD])
    with pytest.raises(TokenizerUnavailableError, match=r'pip install "tbl-loader\[tokenize\]"'):
        tokenize_corpus(src, tmp_path / "tok", tokenizer=corpus["tokenizer"])


def test_existing_destination_needs_overwrite(corpus: dict, tmp_path: Path) -> None:
    src = write_lines(tmp_path / "c.jsonl", [GOOD])
    dst = tmp_path / "tok"
    tokenize_corpus(src, dst, tokenizer=corpus["tokenizer"], eos=0)
    with pytest.raises(DestinationError, match=r"--force \(overwrite=True\)"):  # the CLI's and the API's names
        tokenize_corpus(src, dst, tokenizer=corpus["tokenizer"])
    assert read_documents(dst)[0][0][-1] == 0  # untouched
    tokenize_corpus(src, dst, tokenizer=corpus["tokenizer"], overwrite=True)
    assert read_documents(dst)[0][0][-1] == EOS
    r = cli(str(src), str(dst), "--tokenizer", str(corpus["tokenizer"]))
    assert r.returncode == 2 and "--force" in r.stderr
    with pytest.raises(DestinationError, match="it is never overwritten"):  # a report never replaces the source
        tokenize_corpus(src, tmp_path / "other", tokenizer=corpus["tokenizer"], report=src)
    assert src.read_text() == GOOD + "\n" and not (tmp_path / "other").exists()
