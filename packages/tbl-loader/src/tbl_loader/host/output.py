"""What a batch is made of: output dtypes, backends (torch / numpy), host buffers and device copies.

Host buffers are numpy arrays (``HostArray.root``) in every configuration, so one
liveness rule covers numpy and torch outputs alike: everything handed to a user
is a numpy view of ``root`` or a ``torch.from_numpy`` tensor over such a view,
and both keep a reference to ``root`` for as long as any view, slice or tensor
sharing the memory is alive (numpy collapses view chains onto ``root``; a
``from_numpy`` tensor's storage owns a reference to its array). So
``sys.getrefcount(root)`` rising above its value at allocation means "still held".
Pinned buffers are torch pinned tensors whose memory ``root`` views.

float16 and bfloat16 buffers hold 2-byte bit patterns; torch users receive real
``torch.float16`` / ``torch.bfloat16`` tensors, numpy users ``float16`` arrays and,
for bfloat16 (numpy has no such type), ``uint16`` arrays of the bit patterns.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BACKENDS",
    "HostArray",
    "OUTPUT_DTYPES",
    "OutputSpec",
    "allocate_host",
    "torch_available",
]

OUTPUT_DTYPES = ("bfloat16", "float16", "float32", "uint8")
BACKENDS = ("numpy", "torch")

# Output dtype -> numpy dtype of the host storage, and the dtype kernels write. bfloat16 is stored
# as int16 because that is the 2-byte integer both numpy and torch (for pinned memory) can allocate.
# Pytree leaves are stored in their own numpy dtype (``allocate_host(..., dtype=np.dtype)``).
_STORAGE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.int16),
    "uint8": np.dtype(np.uint8),
    "int64": np.dtype(np.int64),
}
_KERNEL = {**_STORAGE, "bfloat16": np.dtype(np.uint16)}


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _torch():
    import torch  # imported only where torch output is requested

    return torch


@dataclass(frozen=True)
class OutputSpec:
    """Backend and placement of a loader's batches.

    Build it with :meth:`create`, which validates the combination and resolves
    ``backend=None`` (torch when importable, numpy otherwise) and ``pin_memory``
    (a no-op with a ``RuntimeWarning`` when CUDA is unavailable, as torch's
    DataLoader does, so one script runs on GPU and CPU machines).
    """

    backend: str
    device: str | None
    pin_memory: bool

    @classmethod
    def create(cls, backend: str | None = None, device: Any = None, pin_memory: bool = False) -> OutputSpec:
        if backend is None:
            backend = "torch" if torch_available() else "numpy"
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
        if backend == "torch" and not torch_available():
            raise ImportError('backend="torch" needs torch: pip install torch (or pass backend="numpy")')
        if backend == "numpy":
            if device is not None:
                raise ValueError(f'device={device!r} needs backend="torch" (numpy arrays live in host memory)')
            if pin_memory:
                raise ValueError('pin_memory=True needs backend="torch" (numpy cannot allocate pinned memory)')
            return cls("numpy", None, False)
        torch = _torch()
        dev = None
        if device is not None:
            dev_obj = torch.device(device)
            if dev_obj.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"device={device!r} requested but CUDA is not available")
            dev = None if dev_obj.type == "cpu" else str(dev_obj)
        pin = bool(pin_memory)
        if pin and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True has no effect: CUDA is not available, batches stay in pageable memory",
                RuntimeWarning,
                stacklevel=3,
            )
            pin = False
        return cls("torch", dev, pin)

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.startswith("cuda")


class HostArray:
    """One preallocated host buffer.

    ``root`` owns (or, when pinned, views) the memory and is the object whose
    reference count tells whether exported views are still alive; ``kernel`` is
    the view kernels write into; ``pinned`` is the torch tensor owning pinned
    memory, or None.
    """

    __slots__ = ("baseline", "dtype", "kernel", "pinned", "root")

    def __init__(self, root: np.ndarray, dtype: str, pinned: Any = None, kernel: np.ndarray | None = None) -> None:
        self.root = root
        self.dtype = dtype
        self.pinned = pinned
        # ``kernel`` must be a view of ``root`` (e.g. a (rows, row_bytes) uint8 view for gather_rows).
        self.kernel = root.view(_KERNEL.get(dtype, root.dtype)) if kernel is None else kernel
        self.baseline = -1  # set by calibrate() once nothing but this object references root

    def calibrate(self) -> HostArray:
        """Record the reference count of ``root`` while only this object holds it (its attribute
        and the kernel view's base); counted through the same expression as in ``in_use``."""
        self.baseline = sys.getrefcount(self.root)
        return self

    def in_use(self) -> bool:
        """True while anything outside this object references the memory."""
        if self.baseline < 0:
            raise RuntimeError("HostArray.calibrate() was not called")
        return sys.getrefcount(self.root) > self.baseline

    def export(self, rows: int, spec: OutputSpec) -> Any:
        """The first ``rows`` rows as the user's object (numpy view or torch tensor on the host)."""
        view = self.root[:rows] if rows != self.root.shape[0] else self.root
        if spec.backend == "numpy":
            return view.view(np.uint16) if self.dtype == "bfloat16" else view
        torch = _torch()
        tensor = torch.from_numpy(view)
        if self.dtype == "bfloat16":
            tensor = tensor.view(torch.bfloat16)
        return tensor

    def pinned_rows(self, rows: int) -> Any:
        """Torch view of the first ``rows`` rows of the pinned tensor, in the logical dtype."""
        torch = _torch()
        tensor = self.pinned[:rows]
        if self.dtype == "bfloat16":
            tensor = tensor.view(torch.bfloat16)
        return tensor


def _rows_view(root: np.ndarray) -> np.ndarray:
    """``root`` as ``(rows, row_bytes)`` uint8: the layout the row-gather kernels write."""
    row_bytes = root.dtype.itemsize * math.prod(root.shape[1:])
    return root.reshape(-1).view(np.uint8).reshape(root.shape[0], row_bytes)


def allocate_host(shape: tuple[int, ...], dtype: str | np.dtype, spec: OutputSpec, *,
                  as_rows: bool = False) -> HostArray:
    """A new host buffer of ``shape`` holding ``dtype`` values (pinned when ``spec.pin_memory``).

    ``dtype``: an output dtype name (``OUTPUT_DTYPES`` or ``"int64"``), or a numpy
    dtype object for values stored as they are (pytree leaves). ``as_rows=True``
    makes the kernel view ``(rows, row_bytes)`` uint8, for the row-gather kernels.
    """
    if isinstance(dtype, np.dtype):
        storage, name = dtype, dtype.name
    elif dtype in _STORAGE:
        storage, name = _STORAGE[dtype], dtype
    else:
        raise ValueError(f"dtype must be one of {OUTPUT_DTYPES} (or int64) or a numpy dtype, got {dtype!r}")
    if spec.pin_memory:
        torch = _torch()
        torch_dtype = torch.from_numpy(np.empty(0, dtype=storage)).dtype  # same bytes as the numpy storage
        pinned = torch.empty(shape, dtype=torch_dtype, pin_memory=True)
        # No further .view(): numpy collapses a view's base onto the first array that owns
        # its memory or whose base is not an array, and that must be ``root`` itself.
        root = pinned.numpy()
    else:
        pinned, root = None, np.empty(shape, dtype=storage)
    host = HostArray(root, name, pinned, _rows_view(root) if as_rows else None)
    del root, pinned
    # No local name holds root any more: the count now is the count of an unused buffer.
    return host.calibrate()
