"""The image batch: a tuple ``(images, labels, indices)`` with more on its attributes.

``images, labels, indices = batch`` keeps working exactly as when ``Batch`` was
a 3-field named tuple; what a loader serves beside that lives on attributes
that unpacking does not see:

- ``keys``: uint64 numpy array, one per sample: the per-sample keys for user
  randomness (:mod:`tbl_loader.stream.keys`); always on the host;
- ``views``: the images of every crop view (a tuple; ``views[0] is images``);
  more than one with several random-resized-crop specs (multi-crop);
- ``fields``: dict of extra sample leaves by path (empty unless asked for).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Batch", "host_indices"]


class Batch(tuple):
    """``(images, labels, indices)`` plus ``keys``, ``views`` and ``fields`` (see the module docstring)."""

    def __new__(cls, images: Any, labels: Any, indices: Any, *, keys: Any = None, views: tuple[Any, ...] | None = None,
                fields: dict[str, Any] | None = None) -> Batch:
        self = super().__new__(cls, (images, labels, indices))
        self.keys = keys
        self.views = (images,) if views is None else tuple(views)
        self.fields = {} if fields is None else dict(fields)
        return self

    images = property(lambda self: self[0], doc="Images of the first (or only) view.")
    labels = property(lambda self: self[1], doc="Labels, or None without a label leaf.")
    indices = property(lambda self: self[2], doc="Dataset row of every sample (int64, host).")

    def _replace(self, **changes: Any) -> Batch:
        """A copy with some of ``images``, ``labels``, ``indices``, ``keys``, ``views``, ``fields`` replaced.

        Replacing ``images`` alone replaces the first view too."""
        values = {"images": self[0], "labels": self[1], "indices": self[2], "keys": self.keys,
                  "views": self.views, "fields": self.fields}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"Batch has no fields {sorted(unknown)}")
        if "images" in changes and "views" not in changes:
            changes["views"] = (changes["images"], *self.views[1:])
        if "views" in changes and "images" not in changes:
            changes["images"] = tuple(changes["views"])[0]
        values.update(changes)
        return Batch(values["images"], values["labels"], values["indices"], keys=values["keys"],
                     views=values["views"], fields=values["fields"])

    def __reduce__(self) -> Any:
        return (_rebuild, (tuple(self), self.keys, self.views, self.fields))

    def __repr__(self) -> str:
        extra = f", {len(self.views)} views" if len(self.views) > 1 else ""
        fields = f", fields={sorted(self.fields)}" if self.fields else ""
        return f"Batch(images={_shape(self[0])}, labels={_shape(self[1])}, indices={_shape(self[2])}{extra}{fields})"


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "None" if value is None else (str(tuple(shape)) if shape is not None else type(value).__name__)


def _rebuild(items: tuple[Any, Any, Any], keys: Any, views: Any, fields: Any) -> Batch:
    return Batch(*items, keys=keys, views=views, fields=fields)


def host_indices(sample_ids: Any, backend: str) -> Any:
    """A batch's dataset rows as the loader hands them out: a copy (the plan's array is reused), on the host."""
    indices = sample_ids.copy()
    if backend == "torch":
        import torch  # only loaders that output torch get here

        return torch.from_numpy(indices)
    return indices
