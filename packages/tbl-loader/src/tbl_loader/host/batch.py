"""The image batch: a dataclass that unpacks as ``(images, labels, indices)`` and carries the rest by name.

``images, labels, indices = batch`` (and ``batch[0]`` .. ``batch[2]``, ``len(batch) == 3``) keep
working exactly as when ``Batch`` was a tuple; what a loader serves beside
that lives on named fields:

- ``views``: the images of every crop view (a tuple; ``views[0] is images``);
  more than one with several random-resized-crop specs (multi-crop);
- ``labels``: the labels, or None without a label leaf;
- ``indices``: the dataset row of every sample (int64, on the host as the loader hands it out);
- ``keys``: uint64 numpy array, one per sample: the per-sample keys for user
  randomness (:mod:`tbl_loader.stream.keys`); always on the host, never moved;
- ``fields``: dict of extra sample leaves by path (empty unless asked for);
- ``sources``: int64, the source of every sample in a :class:`~tbl_loader.Mix` batch, else None;
- ``crop_boxes``: float64 ``(N, 4)`` ``(top, left, height, width)`` of every sample's first view, in stored
  pixels (the region of the stored image that became the served image), and ``flips``: bool ``(N,)``, whether
  it was flipped horizontally after the crop-resize (:mod:`tbl_loader.image.geometry`); None where a batch
  was made without them.

Why a dataclass and not a tuple: the generic rebuilders of a batch rebuild a
tuple subclass from its items alone (``type(x)(*items)`` in Lightning's
``apply_to_collection``, ``type(x)(items)`` in torch's ``pin_memory``), which
loses every field beside the three unpacked ones. A dataclass is rebuilt field
by field (Lightning copies it and sets each field), and ``.to()`` /
``.pin_memory()`` (below) are what Lightning's ``move_data_to_device`` and torch's
``DataLoader(pin_memory=True)`` call on an object that has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Batch", "PyTreeBatch", "host_indices", "map_tensors", "pytree_batch"]


@dataclass(init=False, eq=False, repr=False)
class Batch:
    """``images, labels, indices = batch`` plus the named fields of the module docstring."""

    views: tuple[Any, ...]
    labels: Any
    indices: Any
    keys: Any = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: Any = None
    crop_boxes: Any = None
    flips: Any = None

    def __init__(self, images: Any, labels: Any, indices: Any, *, keys: Any = None,
                 views: tuple[Any, ...] | None = None, fields: dict[str, Any] | None = None, sources: Any = None,
                 crop_boxes: Any = None, flips: Any = None) -> None:
        views = (images,) if views is None else tuple(views)
        if not views or views[0] is not images:
            raise ValueError("views[0] must be the batch's images (the first view)")
        self.views = views
        self.labels = labels
        self.indices = indices
        self.keys = keys
        self.fields = {} if fields is None else dict(fields)
        self.sources = sources
        self.crop_boxes = crop_boxes
        self.flips = flips

    @property
    def images(self) -> Any:
        """Images of the first (or only) view."""
        return self.views[0]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.views[0], self.labels, self.indices))

    def __getitem__(self, k: int | slice) -> Any:
        return (self.views[0], self.labels, self.indices)[k]

    def __len__(self) -> int:
        return 3  # the unpacked triple, as the former tuple

    def _replace(self, **changes: Any) -> Batch:
        """A copy with some fields replaced (``images`` too: replacing it alone replaces the first view)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        unknown = set(changes) - set(values) - {"images"}
        if unknown:
            raise TypeError(f"Batch has no fields {sorted(unknown)}")
        if "images" in changes and "views" not in changes:
            changes["views"] = (changes["images"], *self.views[1:])
        views = tuple(changes.pop("views", self.views))
        changes.pop("images", None)
        values.update(changes)
        del values["views"]
        return Batch(views[0], views=views, **values)

    def map_tensors(self, function: Callable[[Any], Any]) -> Batch:
        """A copy with ``function`` applied to every torch tensor it carries (``keys`` stay as they are)."""
        views = map_tensors(function, self.views)
        return Batch(views[0], map_tensors(function, self.labels), map_tensors(function, self.indices),
                     keys=self.keys, views=views, fields=map_tensors(function, self.fields),
                     sources=map_tensors(function, self.sources), crop_boxes=map_tensors(function, self.crop_boxes),
                     flips=map_tensors(function, self.flips))

    def to(self, *args: Any, **kwargs: Any) -> Batch:
        """Every tensor moved with ``tensor.to(*args, **kwargs)`` (e.g. ``batch.to("cuda", non_blocking=True)``);
        numpy values (``keys``, numpy-backend batches) stay where they are."""
        return self.map_tensors(lambda t: t.to(*args, **kwargs))

    def pin_memory(self, *args: Any) -> Batch:
        """Every tensor in pinned memory (what torch's ``DataLoader(pin_memory=True)`` calls)."""
        return self.map_tensors(lambda t: t.pin_memory(*args))

    def __repr__(self) -> str:
        extra = f", {len(self.views)} views" if len(self.views) > 1 else ""
        fields = f", fields={sorted(self.fields)}" if self.fields else ""
        return (f"Batch(images={_shape(self.views[0])}, labels={_shape(self.labels)}, "
                f"indices={_shape(self.indices)}{extra}{fields})")


class PyTreeBatch:
    """A batch of sample pytrees: the collated pytree itself, plus where its rows came from.

    What :class:`~tbl_loader.PyTreeLoader`, ``PyTreeDataset.get_batch`` and a :class:`~tbl_loader.Mix` of pytree
    sources yield. It *is* the collated pytree's root container (a :class:`PyTreeDict`, :class:`PyTreeList` or
    :class:`PyTreeTuple`: a ``dict``, ``list`` or ``tuple`` subclass), so ``batch["x"]``, ``x, y = batch`` and
    ``isinstance(batch, dict)`` work as on the plain collated pytree, and it carries, as an image
    :class:`Batch` does:

    - ``indices``: the dataset row of every sample (int64; a tensor on a torch batch);
    - ``sources``: the source of every sample in a Mix batch (int64, like ``indices``), else None.

    ``tree``: the plain root container (no attributes). ``.to()`` / ``.pin_memory()`` / ``map_tensors()`` return
    the same kind with ``indices`` and ``sources`` kept: what Lightning's ``move_data_to_device`` calls (a generic
    rebuild of a dict, list or tuple subclass from its items alone would drop them). A dataset whose samples are
    bare values (no container at the root) has batches that are bare values too: their rows come with
    ``PyTreeLoader(return_indices=True)``.
    """

    __slots__ = ()
    indices: Any
    sources: Any

    @property
    def tree(self) -> Any:
        return _PLAIN[type(self)](self)

    def map_tensors(self, function: Callable[[Any], Any]) -> Any:
        """The same kind of batch with ``function`` applied to every torch tensor it carries."""
        return pytree_batch(map_tensors(function, self.tree), map_tensors(function, self.indices),
                            map_tensors(function, self.sources))

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """Every tensor moved with ``tensor.to(*args, **kwargs)``; numpy values stay where they are."""
        return self.map_tensors(lambda t: t.to(*args, **kwargs))

    def pin_memory(self, *args: Any) -> Any:
        """Every tensor in pinned memory."""
        return self.map_tensors(lambda t: t.pin_memory(*args))


class PyTreeDict(PyTreeBatch, dict):
    """A :class:`PyTreeBatch` whose pytree root is a dict."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self.indices = self.sources = None


class PyTreeList(PyTreeBatch, list):
    """A :class:`PyTreeBatch` whose pytree root is a list."""

    def __init__(self, *args: Any) -> None:
        list.__init__(self, *args)
        self.indices = self.sources = None


class PyTreeTuple(PyTreeBatch, tuple):
    """A :class:`PyTreeBatch` whose pytree root is a tuple."""

    def __init__(self, *args: Any) -> None:
        self.indices = self.sources = None


_PLAIN = {PyTreeDict: dict, PyTreeList: list, PyTreeTuple: tuple}
_WRAPPED = {dict: PyTreeDict, list: PyTreeList, tuple: PyTreeTuple}


def pytree_batch(tree: Any, indices: Any, sources: Any = None) -> Any:
    """``tree`` (a collated pytree) as a :class:`PyTreeBatch` carrying ``indices`` and ``sources``; a bare value
    (a dataset of samples with no container at the root) is returned as it is."""
    kind = _WRAPPED.get(type(tree))
    if kind is None:
        return tree
    batch = kind(tree)
    batch.indices, batch.sources = indices, sources
    return batch


def map_tensors(function: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with ``function`` applied to each torch tensor in it, through Batch, PyTreeBatch, dicts, lists,
    tuples and named tuples (Padded, Masked); everything else is returned as it is."""
    if type(value).__module__.startswith("torch") and _is_tensor(value):
        return function(value)
    if isinstance(value, (Batch, PyTreeBatch)):
        return value.map_tensors(function)
    if isinstance(value, dict):
        return {k: map_tensors(function, v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(function, v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(function, v) for v in value)
    return value


def _is_tensor(value: Any) -> bool:
    import torch  # a value from a torch module: torch is imported already

    return isinstance(value, torch.Tensor)


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "None" if value is None else (str(tuple(shape)) if shape is not None else type(value).__name__)


def host_indices(sample_ids: Any, backend: str) -> Any:
    """A batch's dataset rows as the loader hands them out: a copy (the plan's array is reused), on the host."""
    indices = sample_ids.copy()
    if backend == "torch":
        import torch  # only loaders that output torch get here

        return torch.from_numpy(indices)
    return indices
