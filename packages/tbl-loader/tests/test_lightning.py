"""Lightning's Trainer.fit over a variable-size JPEG dataset with fields: killed mid-epoch and resumed from
its checkpoint, it takes the same steps over the same batches as the straight run.

Each run is its own process: the first one is killed (``os._exit``) two steps after a mid-epoch
checkpoint, as a preempted job is; the resumed one starts from that checkpoint's file. Every step
records its batch (rows, the images' bytes, the fields), compared element by element.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tbl_format

pytest.importorskip("lightning")
simplejpeg = pytest.importorskip("simplejpeg")

ROWS, SHARD_ROWS, BATCH = 60, 12, 8
STEPS_PER_EPOCH = -(-ROWS // BATCH)
EPOCHS = 2

SCRIPT = textwrap.dedent("""
    import hashlib, json, os, sys
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from tbl_loader import ImageLoader, RandomResizedCrop

    path, log, ckpt_dir, mode, at = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            images, labels, indices = batch
            record = {"step": self.global_step, "epoch": self.current_epoch, "batch_idx": batch_idx,
                      "rows": indices.tolist(), "labels": labels.tolist(),
                      "images": hashlib.sha256(images.numpy().tobytes()).hexdigest(),
                      "captions": list(batch.fields["caption"]),
                      "boxes": [b.tolist() for b in batch.fields["boxes"]]}
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\\n")
            return self.lin(images.mean(dim=(2, 3))).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Preempt(Callback):  # the job is killed two steps after the checkpoint, mid-epoch
        def on_train_batch_start(self, trainer, *args):
            if mode == "first" and trainer.global_step == at + 2:
                os._exit(9)

    loader = ImageLoader(path, batch_size=%(batch)d, seed=7, hflip=0.5, fields=("caption", "boxes"),
                         random_resized_crop=RandomResizedCrop(24, scale=(0.3, 1.0)), prefetch=2)
    callbacks = [Preempt()]
    if mode == "first":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=at, save_top_k=-1,
                                         filename="{step}"))
    trainer = L.Trainer(max_epochs=%(epochs)d, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=mode == "first", callbacks=callbacks)
    ckpt = os.path.join(ckpt_dir, f"step={at}.ckpt") if mode == "resume" else None
    trainer.fit(Model(), train_dataloaders=loader, ckpt_path=ckpt)
    print(json.dumps({"global_step": trainer.global_step}))
""") % {"batch": BATCH, "epochs": EPOCHS}


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory):
    rng = np.random.default_rng(3)
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int"), "caption": tbl_format.Leaf("str"),
                                "boxes": tbl_format.Leaf("var_array", dtype="float32", ndim=2)})
    path = tmp_path_factory.mktemp("lightning") / "jpeg"
    with tbl_format.Writer(path, schema, shard_rows=SHARD_ROWS) as w:
        for i in range(ROWS):
            h, wd = (int(v) for v in rng.integers(30, 80, 2))
            y, x = np.mgrid[0:h, 0:wd]
            img = ((rng.integers(0, 256, 3) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorspace="RGB"),
                     "height": h, "width": wd, "label": i, "caption": f"photo {i}",
                     "boxes": rng.random((int(rng.integers(0, 3)), 4), dtype=np.float32)})
    return path


def _run(dataset, tmp_path, mode, at, log):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(dataset), str(log), str(tmp_path / "ckpt"), mode,
                           str(at)], capture_output=True, text=True, timeout=600)
    return proc, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("at", [3, STEPS_PER_EPOCH + 4])  # mid first epoch, mid second epoch
def test_killed_and_resumed_fit_takes_the_straight_runs_steps(jpeg_dataset, tmp_path, at):
    straight_proc, straight = _run(jpeg_dataset, tmp_path, "straight", at, tmp_path / "straight.jsonl")
    assert straight_proc.returncode == 0, straight_proc.stderr[-3000:]
    assert len(straight) == EPOCHS * STEPS_PER_EPOCH
    first_proc, first = _run(jpeg_dataset, tmp_path, "first", at, tmp_path / "first.jsonl")
    assert first_proc.returncode == 9, first_proc.stderr[-3000:]  # killed, as a preempted job is
    assert len(first) == at + 2
    resumed_proc, resumed = _run(jpeg_dataset, tmp_path, "resume", at, tmp_path / "resumed.jsonl")
    assert resumed_proc.returncode == 0, resumed_proc.stderr[-3000:]
    assert json.loads(resumed_proc.stdout.splitlines()[-1])["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert first[:at] + resumed == straight  # same steps, epochs, batch indices, rows, pixels and fields
