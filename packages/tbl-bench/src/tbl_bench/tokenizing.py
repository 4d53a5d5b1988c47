"""`tbl tokenize` throughput against the tokenizers library's own batch encoding of the same texts (the ceiling).

    python -m tbl_bench.tokenizing --data-dir DIR [--mb 200] [--workers 1,2] [--rounds 1] [--json OUT.json]

Workload: a JSONL corpus of about ``--mb`` MB written once under ``--data-dir`` (reused by later runs):
documents of lognormal length (median 300 words, sigma 0.8, clipped to [1, 20000] words) of synthetic
words drawn from a Zipf law over 50,000 word types (seed 0), each line ``{"id": k, "text": ...}``. The
tokenizer is a byte-level BPE of 32,000 ids trained once on the corpus's first 8 MB with the tokenizers
library (written beside it as ``tokenizer.json``, ``</s>`` the eos).

Configurations, each round of each in its own subprocess (``tbl_bench.runner.run_round``):

======================  =====================================================================================
tbl/workers=N           ``tokenize_corpus(corpus, DST, tokenizer=..., workers=N)`` (what ``tbl tokenize`` runs):
                        the counting pass, JSON parsing, encoding in N worker processes, the dataset written
                        and published; DST removed before each epoch (untimed)
tokenizers/encode_batch ``Tokenizer.encode_batch`` over the same texts, held in memory (parsed untimed), in
                        batches of 512, in this one process with the library's own thread pool: the ceiling
                        (no reading, parsing or writing)
======================  =====================================================================================

The figures are documents/s and MB/s of JSONL lines (the same bytes for every configuration); one timed
epoch each after no warm-up (the corpus is in the page cache after it is written or first read).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

from tbl_bench.config import Config
from tbl_bench.runner import run_round

SUITE = "tokenize"
UNIT = "documents/s"
WORD_TYPES = 50_000
TOKENIZER_SAMPLE = 8 << 20
VOCAB = 32_000
ENCODE_BATCH = 512


def _words(rng: np.random.Generator) -> np.ndarray:
    """WORD_TYPES synthetic words of 1..12 letters (a few accented), most frequent first."""
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxzéü"))
    lengths = np.clip(rng.poisson(4.5, WORD_TYPES), 1, 12)
    return np.array(["".join(rng.choice(letters, n)) for n in lengths])


def write_corpus(data_dir: str, mb: int) -> tuple[str, str, int, int]:
    """(corpus path, tokenizer path, documents, bytes): written once under ``data_dir``, then reused."""
    root = Path(data_dir) / f"tokenize-{mb}mb"
    corpus, tokenizer, done = root / "corpus.jsonl", root / "tokenizer.json", root / "corpus.json"
    if done.exists():
        meta = json.loads(done.read_text())
        return str(corpus), str(tokenizer), meta["documents"], meta["bytes"]
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = _words(rng)
    weights = 1.0 / np.arange(1, WORD_TYPES + 1)
    weights /= weights.sum()
    target, size, k = mb * 1_000_000, 0, 0
    with open(corpus, "w", encoding="utf-8") as f:
        while size < target:
            lengths = np.clip(np.rint(rng.lognormal(np.log(300), 0.8, 1000)), 1, 20_000).astype(np.int64)
            ids = rng.choice(WORD_TYPES, int(lengths.sum()), p=weights)
            ends = np.cumsum(lengths)
            lines = []
            for a, b in zip(ends - lengths, ends, strict=True):
                text = " ".join(words[ids[a:b]].tolist())
                lines.append(json.dumps({"id": k, "text": text}, ensure_ascii=False) + "\n")
                k += 1
            chunk = "".join(lines)
            size += len(chunk.encode("utf-8"))
            f.write(chunk)
    _train_tokenizer(corpus, tokenizer)
    done.write_text(json.dumps({"documents": k, "bytes": size}))
    return str(corpus), str(tokenizer), k, size


def _train_tokenizer(corpus: Path, out: Path) -> None:
    import tokenizers

    def sample():
        taken = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                taken += len(line)
                if taken > TOKENIZER_SAMPLE:
                    return
                yield json.loads(line)["text"]

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["</s>"], show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample(), trainer)
    tok.save(str(out))


class _TblTokenize:
    """Workload: one epoch is one whole ``tokenize_corpus`` run into a fresh destination."""

    def __init__(self, corpus: str, tokenizer: str, documents: int, workers: int, out: str) -> None:
        self.corpus, self.tokenizer, self.workers, self.out = corpus, tokenizer, workers, Path(out)
        self.items_per_epoch = documents
        self.info: dict = {}

    def prepare_epoch(self, epoch: int) -> None:
        shutil.rmtree(self.out, ignore_errors=True)

    def run_epoch(self, epoch: int) -> int:
        from tbl_loader.conversion.tokenize import tokenize_corpus

        rep = tokenize_corpus(self.corpus, self.out, tokenizer=self.tokenizer, workers=self.workers, report=False)
        self.info = {"tokens": rep.tokens, "parts": rep.parts, "workers": rep.workers}
        return rep.documents

    def close(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)


def tbl_tokenize(corpus: str, tokenizer: str, documents: int, workers: int, out: str) -> _TblTokenize:
    return _TblTokenize(corpus, tokenizer, documents, workers, out)


class _EncodeBatch:
    """Workload: the library's batch encoding of the corpus's texts, already in memory."""

    def __init__(self, corpus: str, tokenizer: str) -> None:
        import tokenizers

        with open(corpus, encoding="utf-8") as f:
            self.texts = [json.loads(line)["text"] for line in f]
        self.tokenizer = tokenizers.Tokenizer.from_file(tokenizer)
        self.items_per_epoch = len(self.texts)
        self.info: dict = {}

    def run_epoch(self, epoch: int) -> int:
        tokens = 0
        for at in range(0, len(self.texts), ENCODE_BATCH):
            tokens += sum(len(e.ids) for e in self.tokenizer.encode_batch(self.texts[at : at + ENCODE_BATCH]))
        self.info = {"tokens": tokens + len(self.texts)}  # + one eos a document, as tbl tokenize counts
        return len(self.texts)

    def close(self) -> None:
        self.texts = []


def encode_batch(corpus: str, tokenizer: str) -> _EncodeBatch:
    return _EncodeBatch(corpus, tokenizer)


def configurations(corpus: str, tokenizer: str, documents: int, workers: list[int], out: str) -> list[Config]:
    configs = [Config(SUITE, f"tbl/workers={n}", "tbl", "tbl_bench.tokenizing:tbl_tokenize",
                      {"corpus": corpus, "tokenizer": tokenizer, "documents": documents, "workers": n, "out": out},
                      warmup=0, epochs=1, unit=UNIT, timeout_s=3600.0) for n in workers]
    configs.append(Config(SUITE, "tokenizers/encode_batch", "tokenizers", "tbl_bench.tokenizing:encode_batch",
                          {"corpus": corpus, "tokenizer": tokenizer}, role="ceiling", warmup=0, epochs=1, unit=UNIT,
                          timeout_s=3600.0))
    return configs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.tokenizing", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="where the corpus and tokenizer are written (reused)")
    p.add_argument("--mb", type=int, default=200, help="corpus size in MB of JSONL (default 200)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts of tbl tokenize (default 1,2)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", help="write every round's records here")
    args = p.parse_args(argv)
    corpus, tokenizer, documents, size = write_corpus(args.data_dir, args.mb)
    out = str(Path(args.data_dir) / f"tokenize-{args.mb}mb" / "out")
    configs = configurations(corpus, tokenizer, documents, [int(w) for w in args.workers.split(",")], out)
    records: dict[str, list] = {c.name: [] for c in configs}
    print(f"corpus: {documents:,} documents, {size / 1e6:,.1f} MB of JSONL", file=sys.stderr)
    for k in range(args.rounds):
        got = {}
        for config in configs:
            record = run_round(config)
            records[config.name].append(record)
            if record["status"] != "ok":
                print(f"round {k + 1} {config.name}: {record['status']}: {record.get('reason')}", file=sys.stderr)
                return 1
            seconds = statistics.median(record["epochs_s"])
            got[config.name] = documents / seconds
            print(f"round {k + 1} {config.name}: {documents / seconds:,.0f} documents/s, "
                  f"{size / seconds / 1e6:,.2f} MB/s, {record['info']['tokens'] / seconds / 1e6:,.2f}M tokens/s "
                  f"({seconds:.1f} s; load {record['loadavg_before'][0]:.2f} -> {record['loadavg_after'][0]:.2f})")
        ceiling = got["tokenizers/encode_batch"]
        for name, rate in got.items():
            if name.startswith("tbl/"):
                print(f"round {k + 1} {name} / ceiling: {rate / ceiling:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
