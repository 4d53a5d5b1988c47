"""Token windows for language-model pretraining: TBL's TokenLoader against litdata's TokensLoader.

Workload: 200,000,000 uint16 tokens (20,000,000 in a quick run) over 8 shards,
windows of ``T + 1 = 2049`` tokens, batch 32, shuffled. Token ``i`` of the
stream is ``token(i)`` below (a fixed formula, so any window can be checked
without holding the stream). Configurations:

===============  ==================================================================
tbl              ``TokenLoader(dir, 32, 2048, prefetch=2)`` (one producer thread
                 copying windows from the mapped shards), torch batches; at the
                 consume level with ``dtype="int64"`` (converted while copying)
litdata          baseline, with --peers, in the peer interpreter:
                 ``StreamingDataLoader(StreamingDataset(dir, item_loader=TokensLoader(2049),
                 shuffle=True), batch_size=32, num_workers=2)`` (litdata 0.2.76)
===============  ==================================================================

Two levels: *produce* touches one token of each batch, *consume* converts the
batch to int64 (what an embedding lookup takes) and sums it. The consuming
process runs torch with ``CONSUMER_TORCH_THREADS`` (1) intra-op threads for both
loaders: torch's default (one per core) makes the sum of a 32 x 2049 batch a
2-thread parallel region, and on 2 cores that also run the loader (TBL's
producer thread, litdata's 2 worker processes) its second thread waits for a
core, so the sum took milliseconds instead of tens of microseconds and the
level measured torch's thread pool rather than the loaders (profiled: TBL's
consume went from 10M to 280M tokens/s with 1 thread, litdata's from 7.4M
to 10.7M, same machine and minute). litdata's tokens
are written as int16 (torch's uint16 lacks kernels; the same two bytes per
token). One warm-up epoch, in
which TBL's windows are checked element by element against ``token()`` at the
start the loader's rule gives each of them (``window_offset`` + ``j * T``);
then 2 timed epochs. Unit: tokens/s (windows x (T + 1)).
"""

from __future__ import annotations

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "tokens"
TITLE = "Token windows (B=32, T=2048): TokenLoader against litdata's TokensLoader"
UNIT = "tokens/s"
COMPARE_ON = ()

BATCH = 32
SEQ = 2048
SHARDS = 8
TOKENS = 200_000_000
QUICK_TOKENS = 20_000_000
DOC = 1_000_000  # tokens per written document
VOCAB = 50_257


def token(i: np.ndarray) -> np.ndarray:
    """Token ``i`` of the benchmark stream (uint16)."""
    i = i.astype(np.int64)
    return ((i * 48271 + (i >> 7)) % VOCAB).astype(np.uint16)


def documents(tokens: int):
    for a in range(0, tokens, DOC):
        yield token(np.arange(a, min(tokens, a + DOC), dtype=np.int64))


def write_tbl(dst: str, tokens: int) -> None:
    from tbl_loader import write_tokens

    write_tokens(documents(tokens), dst, dtype="uint16", chunk=1 << 16, shard_tokens=-(-tokens // SHARDS))


def write_litdata(dst: str, tokens: int) -> None:
    """Peer preparation: the same stream through `litdata.optimize` with its TokensLoader."""
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    starts = list(range(0, tokens, DOC))
    litdata.optimize(fn=_litdata_doc, inputs=[(a, tokens) for a in starts], output_dir=dst,
                     chunk_size=(SEQ + 1) * 8012, item_loader=TokensLoader(), num_workers=2, verbose=False,
                     mode="overwrite")


def _litdata_doc(item: tuple[int, int]):
    import torch

    a, tokens = item
    yield torch.from_numpy(token(np.arange(a, min(tokens, a + DOC), dtype=np.int64)).astype(np.int16))


LEVELS = ("produce", "consume")
CONSUMER_TORCH_THREADS = 1  # the consuming process's intra-op threads, the same for every loader (see above)


def _use(batch, level: str) -> None:
    """produce: touch one token; consume: the int64 tokens an embedding lookup takes, summed."""
    import torch

    if level == "produce":
        int(batch[0, 0])
    else:
        int(batch.to(torch.int64).sum())


class _Epochs:
    def __init__(self, loader, windows: int, level: str, info: dict, check=None):
        import torch

        torch.set_num_threads(CONSUMER_TORCH_THREADS)  # for every loader alike (module docstring)
        self.loader, self.level, self.info, self.check = loader, level, info, check
        self.info["consumer_torch_threads"] = torch.get_num_threads()
        self.items_per_epoch = windows * (SEQ + 1)

    def run_epoch(self, epoch: int) -> int:
        n = 0
        check = self.check if epoch == 0 else None  # the warm-up epoch: checked, not timed
        for k, batch in enumerate(self.loader):
            _use(batch, self.level)
            if check is not None:
                check(k, batch)
            n += batch.numel()
        return n

    def close(self) -> None:
        if hasattr(self.loader, "close"):
            self.loader.close()
        self.loader = None


def tbl_loader_epochs(path: str, tokens: int, level: str = "consume"):
    """Workload factory: TokenLoader over the TBL token dataset, windows checked in the warm-up epoch."""
    from tbl_loader import TokenLoader
    from tbl_loader.tokens import window_offset

    # consume: the producer thread writes int64 while copying (the loader's dtype option); produce: stored uint16.
    loader = TokenLoader(path, BATCH, SEQ, seed=0, prefetch=2, dtype="int64" if level == "consume" else None)
    order = loader.epoch_order().permutation  # epoch 0's window order, for the check
    offset = window_offset(0, 0, SEQ)
    steps = np.arange(SEQ + 1, dtype=np.int64)
    checked = {"windows": 0}

    def check(k: int, batch) -> None:
        ids = order[k * BATCH : k * BATCH + batch.shape[0]]
        want = token(offset + ids[:, None] * SEQ + steps[None, :])
        if not np.array_equal(batch.numpy(), want.astype(batch.numpy().dtype)):
            raise AssertionError(f"batch {k}: a window differs from the stream")
        checked["windows"] += batch.shape[0]

    return _Epochs(_TokensOnly(loader), loader.num_samples, level, {"checked": checked}, check)


class _TokensOnly:
    """A TokenLoader whose batches are their ``tokens`` tensors, like litdata's, for the shared epoch loop."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        return (batch.tokens for batch in self.loader)

    def close(self) -> None:
        self.loader.close()


def litdata_loader_epochs(path: str, tokens: int, level: str = "consume"):
    """Workload factory: litdata's StreamingDataLoader with its TokensLoader, 2 workers."""
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    ds = litdata.StreamingDataset(input_dir=path, item_loader=TokensLoader(block_size=SEQ + 1), shuffle=True, seed=0)
    loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    return _Epochs(loader, len(ds), level, {"litdata": litdata.__version__})


def configurations(ctx: BenchContext) -> list[Config]:
    tokens = QUICK_TOKENS if ctx.quick else TOKENS
    common = {"warmup": 1, "epochs": 2, "unit": UNIT, "timeout_s": 3600}
    tbl_path = ctx.artifact(f"tokens-{tokens}", {"kind": "tokens", "tokens": tokens},
                            lambda p: write_tbl(str(p), tokens))
    configs = [Config(NAME, f"tbl/{level}", "tbl", "tbl_bench.suites.tokens:tbl_loader_epochs",
                      {"path": str(tbl_path), "tokens": tokens, "level": level}, **common) for level in LEVELS]
    if ctx.peers:
        try:
            lit_path, skip = str(ctx.peer_artifact(f"tokens-{tokens}-litdata", {"kind": "tokens", "tokens": tokens},
                                                   "tbl_bench.suites.tokens:write_litdata",
                                                   {"tokens": tokens})), None
        except DataUnavailable as e:
            lit_path, skip = "", str(e)
        configs += [Config(NAME, f"litdata/{level}", "litdata", "tbl_bench.suites.tokens:litdata_loader_epochs",
                           {"path": lit_path, "tokens": tokens, "level": level}, role="baseline", peer=True, skip=skip,
                           **common) for level in LEVELS]
    return configs


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Token throughput, tbl against litdata."""
    out = {}
    for level in LEVELS:
        tbl, lit = results.get(f"tbl/{level}"), results.get(f"litdata/{level}")
        if tbl and lit:
            out[f"throughput tbl / litdata ({level})"] = tbl["throughput"] / lit["throughput"]
    return out
