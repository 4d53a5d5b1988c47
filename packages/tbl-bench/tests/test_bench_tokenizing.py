"""The tokenize benchmark's workloads, in process on a 1 MB corpus: both encode the same texts into the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from tbl_bench import tokenizing


def test_corpus_is_written_once_and_both_workloads_count_the_same_tokens(tmp_path):
    corpus, tokenizer, documents, size = tokenizing.write_corpus(str(tmp_path), 1)
    assert tokenizing.write_corpus(str(tmp_path), 1) == (corpus, tokenizer, documents, size)  # reused
    lines = Path(corpus).read_bytes().splitlines()
    assert len(lines) == documents and Path(corpus).stat().st_size == size >= 1_000_000
    assert [json.loads(line)["id"] for line in lines[:3]] == [0, 1, 2]
    work = tokenizing.tbl_tokenize(corpus, tokenizer, documents, 2, str(tmp_path / "out"))
    work.prepare_epoch(0)
    assert work.run_epoch(0) == documents == work.items_per_epoch
    ceiling = tokenizing.encode_batch(corpus, tokenizer)
    assert ceiling.run_epoch(0) == documents
    assert ceiling.info["tokens"] == work.info["tokens"]  # the same ids, one eos a document on both sides
    work.close()
    assert not (tmp_path / "out").exists()
