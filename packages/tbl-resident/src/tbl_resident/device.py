"""Which device serves the batches, how much memory it has free, and how work is ordered on it.

Three devices run the same serving code: ``"cuda"`` (batches produced on a side
stream, handed over with events), ``"mps"`` (Apple Metal through torch; one
in-order command queue, so no streams or events are needed) and ``"cpu"``
(plain CPU tensors: the path CI exercises without an accelerator).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["DEVICE_TYPES", "DeviceMemoryError", "DeviceQueue", "free_bytes", "resolve_device"]

DEVICE_TYPES = ("cpu", "cuda", "mps")


class DeviceMemoryError(MemoryError):
    """The dataset (plus the batch workspace) does not fit in the device's free memory."""

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free


def resolve_device(device: Any) -> torch.device:
    """A concrete ``torch.device`` (``"cuda"`` becomes ``cuda:<current>``); raises if it is not usable here."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be one of {DEVICE_TYPES} (or e.g. 'cuda:1'), got {device!r}") from exc
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"device must be one of {DEVICE_TYPES} (or e.g. 'cuda:1'), got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={device!r} requested but torch sees no CUDA device")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device={device!r}: there are {torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", index)
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"device={device!r} requested but torch's MPS backend is not available")
    return dev


def _host_available_bytes() -> int:
    """Memory the kernel could give a new allocation without swapping (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_bytes(device: torch.device) -> int:
    """Bytes a new allocation on ``device`` can take.

    CUDA: the driver's free memory plus what torch's caching allocator holds but
    does not use (it hands that out first). MPS: the recommended working-set size
    minus what the Metal driver has allocated. CPU: the host's available memory.
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(cached, 0))
    if device.type == "mps":
        return max(0, int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()))
    return _host_available_bytes()


class DeviceQueue:
    """Orders batch production against the consumer.

    On CUDA every batch is produced on a side stream; ``produced()`` records an
    event after it, and ``hand_over`` makes the consumer's current stream wait
    for that event and marks the batch's tensors as used by the consumer stream
    (``record_stream``), so that torch's caching allocator never gives their
    memory to anything else before the consumer's queued work on them is done.
    On MPS and CPU work runs in program order and these are no-ops.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def producing(self) -> Iterator[None]:
        """Context in which batch work is enqueued (the side stream on CUDA)."""
        if self.side is None:
            yield
            return
        with torch.cuda.stream(self.side):
            yield

    def produced(self) -> Any:
        """An event marking the end of the work enqueued so far (None off CUDA)."""
        if self.side is None:
            return None
        event = torch.cuda.Event()
        event.record(self.side)
        return event

    def hand_over(self, event: Any, tensors: list[Any]) -> None:
        """Make the consumer's stream wait for ``event`` and own ``tensors`` from here on."""
        if self.side is None:
            return
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in tensors:
            if t is not None:
                t.record_stream(consumer)

    def wait_for_consumer(self) -> None:
        """Make the side stream wait for everything already enqueued on the consumer's stream."""
        if self.side is not None:
            self.side.wait_stream(torch.cuda.current_stream(self.device))

    def synchronize(self) -> None:
        """Block until all work on this device is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()
