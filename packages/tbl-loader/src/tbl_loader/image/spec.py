"""The image contract every image loader serves: one frozen, validated :class:`ImageSpec`.

An ``ImageSpec`` holds what the user asked for (normalization, augmentation,
output dtype and layout, which leaves hold the image and the label) and
validates it once. ``spec.bind(dataset)`` checks a dataset against it and
returns its :class:`ImageColumns`: the mapped image and label columns and the
served geometry. ``spec.stream_settings()`` is what every image loader
fingerprints into its ``state_dict``, so their saved states are interchangeable
on one dataset. :class:`tbl_loader.ImageLoader` and tbl-resident's loader both
build their spec with ``ImageSpec(...)`` from their keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedCombinationError
from ..host.output import OUTPUT_DTYPES
from ..stream import order
from .geometry import check_geometry

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LAYOUTS",
    "VARIABLE_IMAGE_KINDS",
    "ImageColumns",
    "ImageSpec",
    "RandomResizedCrop",
    "EVAL_RULE",
    "resized_center_crop_windows",
    "view_seed",
]

TAG_VIEW_SEED = 66
"""Stream tag of the per-view seeds of multi-crop (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""


def view_seed(seed: int, view: int) -> int:
    """The seed of crop view ``view``: ``seed`` for view 0, else ``hash_u64(seed, 0, TAG_VIEW_SEED, view)``."""
    if view == 0:
        return int(seed)
    return int(order.hash_u64(seed, 0, TAG_VIEW_SEED, np.array([view], np.uint64))[0])

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("CHW", "HWC")
VARIABLE_IMAGE_KINDS = ("var_array", "encoded_image")  # leaf kinds of `tbl convert --max-size` images
EVAL_RULE = "resize-crop"
"""The evaluation transform's rule, fingerprinted with it: torchvision's ``Resize`` of the whole image, then its
``CenterCrop``, for every storage (`resized_center_crop_windows`). A state saved under the earlier rule (a
rounded box crop-resized, on fixed-size storage) refuses to resume instead of continuing with other pixels."""


def resized_center_crop_windows(height, width, resize: int, crop_h: int, crop_w: int) -> np.ndarray:
    """float64 ``(n, 4)`` windows of torchvision's ``Resize(resize)`` + ``CenterCrop((crop_h, crop_w))``, exactly.

    torchvision's geometry per image: the shorter side becomes ``resize``, the
    longer ``int(resize * long / short)``; the crop starts at
    ``round((resized - crop) / 2)`` (half to even). The window is that crop in
    source pixels, ``(top * H / H', left * W / W', crop_h * H / H', crop_w * W / W')``,
    for ``tbl_kernels.resize_crop_images``, whose rule (taps on the whole image)
    makes it the whole-image resize followed by the crop. Where float64 rounding
    puts ``top + height`` an ulp past the side, ``top`` moves down by ulps until it fits.
    """
    h = np.asarray(height, dtype=np.int64).reshape(-1)
    w = np.asarray(width, dtype=np.int64).reshape(-1)
    if h.size and (h.min() < 1 or w.min() < 1):
        raise ValueError("image sizes must be positive")
    short, long = np.minimum(h, w), np.maximum(h, w)
    new_long = np.floor((resize * long) / short).astype(np.int64)  # int(resize * long / short), all positive
    new_h = np.where(w <= h, new_long, resize)
    new_w = np.where(w <= h, resize, new_long)
    top = np.rint((new_h - crop_h) / 2.0)  # torchvision's CenterCrop offset (round half to even)
    left = np.rint((new_w - crop_w) / 2.0)
    windows = np.stack([(top * h) / new_h, (left * w) / new_w, (crop_h * h) / new_h, (crop_w * w) / new_w], axis=1)
    return fit_windows(windows, np.stack([h, w], axis=1))


def fit_windows(windows: np.ndarray, full_hw: np.ndarray) -> np.ndarray:
    """``windows`` with each size capped at its side and each start lowered by ulps where ``start + size``
    exceeds the side in float64 (scaling a window onto a decoded image can round it past the edge)."""
    windows = np.array(windows, dtype=np.float64)
    sides = np.asarray(full_hw, dtype=np.float64)
    for axis in (0, 1):
        windows[:, axis + 2] = np.minimum(windows[:, axis + 2], sides[:, axis])  # then start 0 always fits
        over = windows[:, axis] + windows[:, axis + 2] > sides[:, axis]
        while over.any():
            windows[over, axis] = np.maximum(np.nextafter(windows[over, axis], 0.0), 0.0)
            over = windows[:, axis] + windows[:, axis + 2] > sides[:, axis]
    return windows


def _size_pair(name: str, size: Any) -> tuple[int, int]:
    """``size`` (an int or an (height, width) pair) as a validated ``(height, width)``; ``name`` names it in errors."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    else:
        try:
            pair = tuple(int(v) for v in size)
        except TypeError:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {size!r}") from None
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{name} must be a positive int or (height, width) pair, got {size!r}")
    return pair


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision-style random-resized-crop: output ``size`` (int or (h, w)), area ``scale``, aspect ``ratio``."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)

    @property
    def output_size(self) -> tuple[int, int]:
        return _size_pair("RandomResizedCrop.size", self.size)

    def describe(self) -> dict[str, Any]:
        return {"size": list(self.output_size), "scale": [float(v) for v in self.scale],
                "ratio": [float(v) for v in self.ratio]}


@dataclass(frozen=True)
class ImageColumns:
    """A dataset's image and label columns as one image loader serves them.

    ``images``: uint8 ``(rows, H, W, C)`` segments, one per shard, all alike and
    C-contiguous; ``labels``: int64 ``(rows,)`` segments or None; ``out_hw``: the
    served height and width; ``center_box``: the fixed ``(top, left, h, w)``
    crop (int32) of a center crop without resize, else None; ``center_window``: the float64
    ``(top, left, h, w)`` window of the evaluation transform (``resize`` + ``center_crop``), else None.
    """

    images: list[np.ndarray]
    labels: list[np.ndarray] | None
    height: int
    width: int
    channels: int
    out_hw: tuple[int, int]
    center_box: np.ndarray | None
    label_field: bool = False  # a label leaf that is not int64 (rows,): served through the extra-field path
    center_window: np.ndarray | None = None

    @property
    def num_samples(self) -> int:
        return sum(s.shape[0] for s in self.images)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    def out_shape(self, layout: str) -> tuple[int, int, int]:
        """One served image's shape in ``layout``."""
        return (self.channels, *self.out_hw) if layout == "CHW" else (*self.out_hw, self.channels)


@dataclass(frozen=True)
class ImageSpec:
    """What an image loader serves, validated at construction.

    ``mean`` / ``std``: per-channel normalization (see the normalization table in
    tbl-kernels; unused for ``dtype="uint8"``). ``hflip``: flip probability.
    ``random_resized_crop`` (a :class:`RandomResizedCrop`) or ``center_crop``
    (int or (h, w): the centred box of that size, no resize) set the output
    size, otherwise the stored size. ``resize`` (an int R, with ``center_crop``):
    the evaluation transform, shorter side resized to R then the centred
    ``center_crop``, exactly torchvision's geometry on every storage (`resized_center_crop_windows`). ``dtype``: ``"float32"``, ``"float16"``,
    ``"bfloat16"`` or ``"uint8"``. ``layout``: ``"CHW"`` or ``"HWC"``.
    ``image_key`` / ``label_key``: the leaves holding the image and the label.
    Multi-crop: ``random_resized_crop`` may be a list of :class:`RandomResizedCrop`
    specs, one per view; the first stays ``random_resized_crop``, the others become
    ``extra_crops``. View ``v`` draws its crop and flip with the seed
    ``view_seed(seed, v)`` (view 0 with ``seed`` itself, so a single view is unchanged).
    ``geometry``: ``{field path: "xyxy"}``, served fields holding boxes that follow the first view's crop,
    resize and flip (:mod:`tbl_loader.image.geometry`).
    """

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    hflip: float = 0.0
    random_resized_crop: RandomResizedCrop | None = None
    center_crop: tuple[int, int] | None = None
    dtype: str = "float32"
    layout: str = "CHW"
    image_key: str = "image"
    label_key: str = "label"
    resize: int | None = None
    extra_crops: tuple[RandomResizedCrop, ...] = ()
    geometry: Any = ()

    def __post_init__(self) -> None:
        # {field path: kind} (tbl_loader.image.geometry), kept as sorted pairs so that the spec stays hashable
        geometry = dict(self.geometry) if isinstance(self.geometry, tuple) else self.geometry  # () or a replace()
        object.__setattr__(self, "geometry", tuple(sorted(check_geometry(geometry).items())))
        crops = self.random_resized_crop
        if isinstance(crops, (list, tuple)):  # multi-crop: the first spec is view 0, the others extra views
            if not crops:
                raise ValueError("random_resized_crop needs at least one RandomResizedCrop")
            object.__setattr__(self, "random_resized_crop", crops[0])
            object.__setattr__(self, "extra_crops", (*tuple(crops[1:]), *self.extra_crops))
        for extra in self.extra_crops:
            if not isinstance(extra, RandomResizedCrop):
                raise TypeError(f"random_resized_crop views must be RandomResizedCrop, got {type(extra).__name__}")
            order.random_resized_crop_boxes(0, 0, np.zeros(1, np.int64), extra.output_size[0],
                                            extra.output_size[1], extra.scale, extra.ratio)
        object.__setattr__(self, "extra_crops", tuple(self.extra_crops))
        if self.dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        hflip = float(self.hflip)
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"hflip is a probability in [0, 1], got {hflip}")
        crop = self.random_resized_crop
        if crop is not None and self.center_crop is not None:
            raise ValueError("random_resized_crop and center_crop are exclusive: pass one of them")
        if crop is not None:
            if not isinstance(crop, RandomResizedCrop):
                raise TypeError(f"random_resized_crop must be a RandomResizedCrop, got {type(crop).__name__}")
            # Size, scale and ratio are checked now, before any batch is made.
            order.random_resized_crop_boxes(0, 0, np.zeros(1, np.int64), crop.output_size[0], crop.output_size[1],
                                            crop.scale, crop.ratio)
        center = None if self.center_crop is None else _size_pair("center_crop", self.center_crop)
        if self.resize is not None:
            if isinstance(self.resize, bool) or not isinstance(self.resize, (int, np.integer)) or self.resize < 1:
                raise ValueError(f"resize must be a positive int (the shorter side), got {self.resize!r}")
            if center is None:
                raise ValueError("resize goes with center_crop (resize the shorter side, then crop the centre)")
            if max(center) > self.resize:
                raise ValueError(f"center_crop {center} must fit in the shorter side resize={self.resize}")
            object.__setattr__(self, "resize", int(self.resize))
        object.__setattr__(self, "hflip", hflip)
        object.__setattr__(self, "center_crop", center)
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))

    @property
    def geometry_fields(self) -> dict[str, str]:
        """``{field path: geometry kind}`` of the declared geometry fields."""
        return dict(self.geometry)

    @property
    def normalized(self) -> bool:
        """True when images are normalized through mean / std (every dtype but uint8)."""
        return self.dtype != "uint8"

    def stream_settings(self) -> dict[str, Any]:
        """The image settings that change the sample stream, as fingerprinted by ``state_dict()``."""
        crop = None
        if self.random_resized_crop is not None:
            crop = {"random_resized": self.random_resized_crop.describe()}
        elif self.center_crop is not None:
            crop = {"center": list(self.center_crop)}
            if self.resize is not None:
                crop["resize"] = self.resize
        settings = {"hflip": self.hflip, "crop": crop, "image_key": self.image_key, "label_key": self.label_key}
        if self.resize is not None and self.random_resized_crop is None:
            settings["eval_rule"] = EVAL_RULE
        if self.extra_crops:  # only when set: states of single-view loaders keep their fingerprint
            settings["extra_crops"] = [c.describe() for c in self.extra_crops]
        return settings

    @property
    def crops(self) -> tuple[RandomResizedCrop, ...]:
        """Every random-resized-crop view, in order (empty without random_resized_crop)."""
        first = () if self.random_resized_crop is None else (self.random_resized_crop,)
        return (*first, *self.extra_crops)

    def bind(self, dataset: Any, *, any_label: bool = False) -> ImageColumns:
        """``dataset``'s columns checked against this spec (ValueError naming the leaf and the rule broken).

        ``any_label``: a label leaf of another kind than int64 scalars (float, array, ...) is left to
        the caller (``labels`` None, ``label_field`` True) instead of refused.
        """
        images, labels = _columns(dataset, self.image_key, self.label_key, any_label)
        label_field = labels is None and any_label and self.label_key in dataset.leaf_paths
        _, height, width, channels = images[0].shape
        if self.normalized and (len(self.mean) != channels or len(self.std) != channels):
            raise ValueError(
                f"mean and std need one value per channel ({channels}), got {len(self.mean)} and {len(self.std)}"
            )
        center_box = center_window = None
        if self.random_resized_crop is not None:
            out_hw = self.random_resized_crop.output_size
        elif self.center_crop is not None:
            out_hw = self.center_crop
            if self.resize is None:
                center_box = order.center_crop_box(height, width, *out_hw)
            else:
                center_window = resized_center_crop_windows([height], [width], self.resize, *out_hw)[0]
        else:
            out_hw = (height, width)
        return ImageColumns(images, labels, height, width, channels, out_hw, center_box, label_field, center_window)


def _columns(dataset: Any, image_key: str, label_key: str,
             any_label: bool = False) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The validated image segments and the label segments (or None without a ``label_key`` leaf)."""
    paths = list(dataset.leaf_paths)
    if image_key not in paths:
        raise ValueError(f"dataset has no {image_key!r} leaf (leaves: {paths})")
    kind = dataset.schema.leaves[image_key]
    if kind.kind in VARIABLE_IMAGE_KINDS:
        raise UnsupportedCombinationError(
            f"leaf {image_key!r} holds images of variable size ({kind.kind}; tbl convert --max-size); this "
            "binding reads one fixed-size (rows, H, W, C) column, as tbl-resident uploads it to the device: "
            "serve them with tbl_loader.ImageLoader, or convert with --size S")
    images = [s for s in dataset.segments(image_key) if s.shape[0] > 0]
    if not images:
        raise ValueError("dataset has no samples")
    first = images[0]
    for k, seg in enumerate(images):
        if not isinstance(seg, np.ndarray) or seg.dtype != np.uint8 or seg.ndim != 4:
            raise ValueError(
                f"leaf {image_key!r} segment {k} must be a uint8 (rows, H, W, C) array, got "
                f"{getattr(seg, 'dtype', type(seg).__name__)} {getattr(seg, 'shape', '')}"
            )
        if seg.shape[1:] != first.shape[1:]:
            raise ValueError(f"leaf {image_key!r} segment {k} has images {seg.shape[1:]}, segment 0 {first.shape[1:]}")
        if not seg.flags.c_contiguous:
            raise ValueError(f"leaf {image_key!r} segment {k} is not C-contiguous")
    if first.shape[3] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {first.shape[3]}")
    if label_key not in paths:
        return images, None
    if any_label and not _int64_scalar_leaf(dataset, label_key):
        return images, None
    raw = [s for s in dataset.segments(label_key) if s.shape[0] > 0]
    if [s.shape[0] for s in raw] != [s.shape[0] for s in images]:
        raise ValueError(f"leaf {label_key!r} rows per shard differ from {image_key!r}")
    labels = []
    for k, seg in enumerate(raw):
        if not isinstance(seg, np.ndarray) or seg.dtype != np.int64 or seg.ndim != 1 or not seg.flags.c_contiguous:
            raise ValueError(
                f"leaf {label_key!r} segment {k} must be a contiguous int64 (rows,) array, got "
                f"{getattr(seg, 'dtype', type(seg).__name__)} {getattr(seg, 'shape', '')}"
            )
        labels.append(seg)
    return images, labels


def _int64_scalar_leaf(dataset: Any, key: str) -> bool:
    """Whether leaf ``key`` is a required int64 scalar (the label fast path), from the schema alone."""
    leaf = dataset.schema.leaves[key]
    return leaf.kind == "int" and not leaf.optional
