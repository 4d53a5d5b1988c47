"""User transforms on a loader's batches: ``transform=`` on the producer thread, ``device_transform=`` after the copy.

``transform(batch) -> batch`` runs on the loader's producer thread (with
``prefetch=0``, which has no thread, inline in ``next()``), on the host batch (the same object the loader would yield without a device: torch
CPU tensors or numpy arrays, plus ``batch.keys``), ``prefetch`` batches ahead
of training. numpy and torch CPU operations release the GIL for their heavy
parts, so they overlap the training step. Whatever it returns is what the
loader yields, moved to ``device`` when one is set (tensors only, recursively
through ``Batch``, tuples, lists and dicts; a Batch's ``indices``, ``keys``, ``sources``,
``crop_boxes`` and ``flips`` stay on the host). It may work in place on the batch's arrays (they are the loader's
ring buffers, reused only once nothing references them) or return new ones.

``device_transform(batch) -> batch`` runs on the consumer thread, on the
batch as handed out (on the device when one is set): GPU augmentation.

Determinism: draw randomness from ``batch.keys`` (:mod:`tbl_loader.stream.keys`), one
key per sample, never from a global generator; then the stream is the same
with any prefetch depth, batch size, world size or resume (tested).

An exception raised by ``transform`` reaches the loop with its own type and
traceback, as any producer error does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..stream.order import BatchPlan
from .batch import Batch
from .output import OutputSpec

__all__ = ["TransformStage", "check_transform"]


def check_transform(name: str, value: Any) -> Callable[[Any], Any] | None:
    """``value`` if it is None or callable, else TypeError naming the argument."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable taking and returning a batch, got {type(value).__name__}")
    return value


class TransformStage:
    """The user's transforms of one loader. References no loader (it runs on the producer thread).

    ``host_batch(outputs, payload, plan)``: the batch from host exports of a slot, as the loader
    builds it without a device.
    """

    def __init__(self, host_batch: Callable[[dict[str, Any], Any, BatchPlan], Any], output: OutputSpec,
                 transform: Callable[[Any], Any] | None, device_transform: Callable[[Any], Any] | None) -> None:
        self.host_batch = host_batch
        self.host = OutputSpec(output.backend, None, False)
        self.output = output
        self.transform = check_transform("transform", transform)
        self.device_transform = check_transform("device_transform", device_transform)

    def on_producer(self, slot: Any, plan: BatchPlan) -> None:
        """Producer thread: replace the slot's payload by the transformed host batch."""
        if self.transform is None:
            return
        n = plan.sample_ids.shape[0]
        outputs = {name: a.export(n, self.host) for name, a in slot.arrays.items()}
        slot.payload = self.transform(self.host_batch(outputs, slot.payload, plan))

    def to_output(self, batch: Any) -> Any:
        """Consumer thread: the transformed batch placed as the loader's output (device copies when asked)."""
        if self.output.device is None:
            return batch
        return _to_device(batch, self.output.device, self.output.cuda)


def _to_device(obj: Any, device: str, non_blocking: bool) -> Any:
    import torch  # a device is set only with torch outputs

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device, non_blocking=non_blocking)
        if isinstance(value, Batch):  # the per-sample metadata (indices, keys, sources, crops) stays on the host
            return value._replace(views=tuple(move(v) for v in value.views), labels=move(value.labels),
                                  fields={k: move(v) for k, v in value.fields.items()})
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(move(v) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        return value

    return move(obj)
