"""Sequence packing: TBL's TokenLoader(pack=...) against Grain's first-fit and best-fit packing.

    python -m tbl_bench.packing --data-dir DIR [--documents 1000000] [--rounds 1] [--json OUT.json]

Workload: ``--documents`` documents whose lengths are lognormal (median 400 tokens, sigma 1, rounded,
clipped to [1, 32768]: a long tail to 32k), seed 0; token ``i`` of the stream is ``token(i)`` below. Rows
of 4096 token slots (TBL: ``seq_len=4095``, rows of ``T + 1`` slots; Grain: ``length_struct=4096``),
batches of 16, 64 open rows (TBL ``pack_buffer``, Grain ``num_packing_bins``). TBL reads the token
dataset written once under ``--data-dir`` (reused by later runs); Grain packs the same documents held in
memory, fed as pieces of at most 4096 tokens (Grain would truncate a longer one; TBL cuts it itself).

Configurations, each round of each in its own subprocess (``tbl_bench.runner.run_round``):

=====================  ==============================================================================
tbl/first_fit          ``TokenLoader(dir, 16, 4095, pack="first_fit", pack_buffer=64)``, numpy batches
tbl/best_fit           the same with ``pack="best_fit"``
grain/first_fit        ``FirstFitPackIterDataset(docs, length_struct={"tokens": 4096}, num_packing_bins=64)``
                       then ``.batch(16)``, no worker processes
grain/best_fit         ``BestFitPackIterDataset``, the same
=====================  ==============================================================================

The figure is document tokens packed per second over a whole epoch, batches ready in memory (every batch
is touched, nothing more): the stream's tokens divided by the epoch's time. TBL packs once, when the
loader is built: that time is ``setup_s`` (reported beside it, with the first epoch's tokens/s including
it), and every epoch serves the same rows in a new order. Grain packs as it iterates. Each record's
``info`` holds the padding fraction: padding slots over all slots of the rows (TBL's rows hold one token
more than its inputs, the next-token target of the last one; the slot counts are equal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from tbl_bench.config import Config
from tbl_bench.runner import run_round

SUITE = "packing"
UNIT = "tokens/s"
SLOTS = 4096
BATCH = 16
BUFFER = 64
MAX_LENGTH = 32768


def token(i: np.ndarray) -> np.ndarray:
    """Token ``i`` of the stream: a fixed formula (uint16)."""
    return ((i.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(50_000)).astype(np.uint16)


def document_lengths(documents: int) -> np.ndarray:
    """Lognormal lengths, median 400, clipped to [1, 32768] (int64)."""
    rng = np.random.default_rng(0)
    return np.clip(np.rint(rng.lognormal(np.log(400), 1.0, documents)), 1, MAX_LENGTH).astype(np.int64)


def stream(lengths: np.ndarray) -> np.ndarray:
    """Every token of the stream, computed in pieces (the formula's int64 temporaries stay small)."""
    count = int(lengths.sum())
    flat = np.empty(count, np.uint16)
    step = 1 << 24
    for at in range(0, count, step):
        flat[at : at + step] = token(np.arange(at, min(count, at + step), dtype=np.int64))
    return flat


def write_dataset(data_dir: str, documents: int) -> str:
    """The TBL token dataset of the workload under ``data_dir`` (written once, reused)."""
    from tbl_loader import write_tokens

    path = Path(data_dir) / f"packing-{documents}"
    if (path / "manifest.json").exists():
        return str(path)
    lengths = document_lengths(documents)
    flat = stream(lengths)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    docs = (flat[bounds[k] : bounds[k + 1]] for k in range(documents))
    write_tokens(docs, path, dtype="uint16", chunk=65536, shard_tokens=1 << 26)
    return str(path)


class _Epochs:
    """A workload for the child: ``run_epoch`` returns the stream's tokens once every batch is out."""

    def __init__(self, epoch_batches, tokens: int, info: dict) -> None:
        self._epoch_batches = epoch_batches
        self.items_per_epoch = tokens
        self.info = info

    def run_epoch(self, epoch: int) -> int:
        for batch in self._epoch_batches(epoch):
            int(batch[0, 0])  # ready in memory: touch it
        return self.items_per_epoch

    def close(self) -> None:
        pass


def tbl_packing(path: str, mode: str) -> _Epochs:
    """Workload factory: TokenLoader over the dataset, packed once at construction (timed as setup)."""
    from tbl_loader import TokenLoader

    loader = TokenLoader(path, BATCH, SLOTS - 1, seed=0, pack=mode, pack_buffer=BUFFER, backend="numpy")

    def batches(epoch: int):
        loader.set_epoch(epoch)
        return (b.tokens for b in loader)

    info = {"padding_fraction": loader.padding_fraction, "rows": loader.num_samples}
    return _Epochs(batches, loader.num_tokens, info)


def grain_packing(documents: int, mode: str) -> _Epochs:
    """Workload factory: Grain's packing of the same documents, as pieces of at most 4096 tokens."""
    import grain
    import grain.experimental as gx

    lengths = document_lengths(documents)
    flat = stream(lengths)
    cut = [int(b) for start, n in zip(np.cumsum(lengths) - lengths, lengths, strict=True)
           for b in range(int(start), int(start + n), SLOTS)]
    pieces = [{"tokens": piece} for piece in np.split(flat, cut[1:])]
    pack = gx.FirstFitPackIterDataset if mode == "first_fit" else gx.BestFitPackIterDataset
    info = {"padding_fraction": None, "rows": None}

    def batches(epoch: int):
        ds = grain.MapDataset.source(pieces).to_iter_dataset()
        packed = pack(ds, length_struct={"tokens": SLOTS}, num_packing_bins=BUFFER, seed=epoch).batch(BATCH)
        pad = rows = 0
        for batch in packed:
            pad += int((batch["tokens_segment_ids"] == 0).sum())
            rows += batch["tokens"].shape[0]
            yield batch["tokens"]
        info["padding_fraction"], info["rows"] = pad / (rows * SLOTS), rows

    return _Epochs(batches, int(lengths.sum()), info)


def configurations(path: str, documents: int, epochs: int) -> list[Config]:
    configs = [Config(SUITE, f"tbl/{mode}", "tbl", "tbl_bench.packing:tbl_packing", {"path": path, "mode": mode},
                      warmup=1, epochs=epochs, unit=UNIT) for mode in ("first_fit", "best_fit")]
    configs += [Config(SUITE, f"grain/{mode}", "grain", "tbl_bench.packing:grain_packing",
                       {"documents": documents, "mode": mode}, role="baseline", warmup=0, epochs=1, unit=UNIT,
                       timeout_s=3600.0) for mode in ("first_fit", "best_fit")]
    return configs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.packing", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="where the token dataset is written (reused across runs)")
    p.add_argument("--documents", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2, help="timed TBL epochs per round (after 1 warm-up epoch)")
    p.add_argument("--json", help="write every round's records here")
    args = p.parse_args(argv)
    path = write_dataset(args.data_dir, args.documents)
    configs = configurations(path, args.documents, args.epochs)
    records: dict[str, list] = {c.name: [] for c in configs}
    for k in range(args.rounds):
        got = {}
        for config in configs:
            record = run_round(config)
            records[config.name].append(record)
            if record["status"] != "ok":
                print(f"round {k + 1} {config.name}: {record['status']}: {record.get('reason')}", file=sys.stderr)
                return 1
            tokens = record["items_per_epoch"]
            got[config.name] = tokens / statistics.median(record["epochs_s"])
            first = tokens / (record["setup_s"] + record["epochs_s"][0])
            print(f"round {k + 1} {config.name}: {got[config.name] / 1e6:,.1f}M tokens/s per epoch, "
                  f"{first / 1e6:,.1f}M with setup ({record['setup_s']:.1f} s) in the first, padding "
                  f"{record['info']['padding_fraction']:.4f} over {record['info']['rows']:,} rows "
                  f"(load {record['loadavg_before'][0]:.2f} -> {record['loadavg_after'][0]:.2f})")
        for mode in ("first_fit", "best_fit"):
            print(f"round {k + 1} tbl/{mode} / grain/{mode}: {got[f'tbl/{mode}'] / got[f'grain/{mode}']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
