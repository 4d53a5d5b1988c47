"""The compiled kernels this loader was built against, checked at import.

The loader pins ``tbl-kernels`` to a range of minor series and knows the binding
ABI of each (``KERNELS_ABIS``). The pin has one home: the dependency in
tbl-loader's pyproject.toml, read here from the installed package metadata. A
mismatch fails at import with the installed and required versions and the pip
command that fixes it, instead of failing later inside a kernel call.

Every series the pin admits serves everything that series' bindings can: the
fixed-size paths run on all of them. A feature that needs a newer binding asks
for it (``per_sample_kernels``) and raises ``KernelsFeatureError`` naming the
pip command on older kernels; it never falls back to other code.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from types import ModuleType

from .errors import KernelsFeatureError

__all__ = [
    "KERNELS_ABIS",
    "KERNELS_PIN",
    "KernelsPin",
    "check_kernels",
    "kernels",
    "parse_kernels_pin",
    "jpeg_decode_kernels",
    "per_sample_kernels",
]

KERNELS_ABIS = {(0, 1): 2, (0, 2): 3, (0, 3): 4}
"""The binding ABI of each tbl-kernels minor series this loader calls: 0.1 has ABI 2, 0.2 adds
``crop_resize_images`` (ABI 3), 0.3 the JPEG decode in the batch pass (ABI 4). Every series the pin
admits must be listed (a test checks it)."""

PER_SAMPLE_ABI = 3
"""The first ABI with ``crop_resize_images`` and ``resize_crop_images`` (one image of its own size per sample)."""

PER_SAMPLE_FUNCTIONS = ("crop_resize_images", "resize_crop_images")
"""What variable-size images call. Both belong to ABI 3; builds of 0.2.0 made before ``resize_crop_images``
was added (never released) lack it, so the check asks for the functions as well as the ABI."""

JPEG_DECODE_ABI = 4
"""The first ABI with ``decode_crop_resize_jpegs`` and ``decode_resize_crop_jpegs`` (JPEG decode in the batch pass)."""

JPEG_DECODE_FUNCTIONS = ("decode_crop_resize_jpegs", "decode_resize_crop_jpegs", "jpeg_decoder")

CHECKOUT_COMMAND = "pip install ./packages/tbl-kernels"
"""The same fix from a TBL source checkout, where the kernels are built from the tree."""

_CLAUSE = re.compile(r"\s*(>=|<)\s*(\d+(?:\.\d+)*)\s*")


@dataclass(frozen=True)
class KernelsPin:
    """tbl-loader's range of supported kernels: ``minimum <= release < below``."""

    minimum: tuple[int, ...]
    below: tuple[int, ...]

    @property
    def requirement(self) -> str:
        return f"tbl-kernels>={_dotted(self.minimum)},<{_dotted(self.below)}"

    def admits(self, version: str | None) -> bool:
        release = _release(version)
        return release is not None and self.minimum <= release and release[: len(self.below)] < self.below

    @property
    def fix(self) -> str:
        return f'pip install "{self.requirement}" (from a TBL checkout: {CHECKOUT_COMMAND})'


def _dotted(parts: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in parts)


def _release(version: str | None) -> tuple[int, ...] | None:
    """The numeric release part of a version string ("0.1.2rc1+local" -> (0, 1, 2)); None if unparsable."""
    m = re.match(r"(\d+(?:\.\d+)*)", str(version)) if version is not None else None
    return tuple(int(v) for v in m.group(1).split(".")) if m else None


def parse_kernels_pin(requirements: list[str]) -> KernelsPin:
    """The tbl-kernels pin among ``requirements`` (as importlib.metadata.requires returns them).

    The pin must read ``>=MIN,<NEXT`` in either order (the installed metadata
    may reorder the clauses), with no environment marker and no other operator.
    Anything else is a packaging bug and raises ValueError naming the requirement.
    """
    found = []
    for req in requirements:
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", req)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == "tbl-kernels":
            found.append((req, m.group(2)))
    if len(found) != 1:
        raise ValueError(f"tbl-loader's metadata must require tbl-kernels exactly once (found {len(found)})")
    req, spec = found[0]
    clauses = [_CLAUSE.fullmatch(part) for part in spec.split(",")]
    ops = {c.group(1): tuple(int(v) for v in c.group(2).split(".")) for c in clauses if c}
    if not all(clauses) or len(clauses) != 2 or set(ops) != {">=", "<"}:
        raise ValueError(f"tbl-loader must pin tbl-kernels as >=MIN,<NEXT (got {req!r})")
    return KernelsPin(minimum=ops[">="], below=ops["<"])


def _installed_pin() -> KernelsPin:
    try:
        requirements = importlib.metadata.requires("tbl-loader") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError(
            "tbl-loader's package metadata is missing (it is imported without being installed); "
            "install it: pip install tbl-loader (from a TBL checkout: pip install ./packages/tbl-loader)"
        ) from exc
    return parse_kernels_pin(requirements)


KERNELS_PIN = _installed_pin()
"""The pinned range, read from the installed metadata (the pyproject.toml dependency)."""


def check_kernels(module: ModuleType, pin: KernelsPin = KERNELS_PIN) -> ModuleType:
    """Return ``module`` if its version and ABI are the ones this loader supports, else raise ImportError."""
    version = getattr(module, "__version__", None)
    abi = getattr(module, "KERNELS_ABI", None)
    if not pin.admits(version):
        raise ImportError(
            f"tbl-loader needs {pin.requirement} but tbl-kernels {version} is installed; fix it with: {pin.fix}"
        )
    expected = KERNELS_ABIS.get(_release(version)[:2])
    if abi != expected:
        raise ImportError(
            f"tbl-loader expects tbl-kernels {version} to have binding ABI {expected} but it has ABI {abi}; "
            f"fix it with: {pin.fix}"
        )
    return module


def per_sample_kernels(module: ModuleType | None = None) -> ModuleType:
    """The kernels, if they have ``crop_resize_images`` and ``resize_crop_images`` (tbl-kernels 0.2, ABI 3);
    else KernelsFeatureError.

    Variable-size image datasets need them: one image of its own size per sample.
    """
    module = kernels if module is None else module
    missing = [name for name in PER_SAMPLE_FUNCTIONS if not callable(getattr(module, name, None))]
    if getattr(module, "KERNELS_ABI", 0) >= PER_SAMPLE_ABI and not missing:
        return module
    need = KernelsPin(minimum=(0, 2, 0), below=KERNELS_PIN.below)
    lacking = ", ".join(missing) if missing else ", ".join(PER_SAMPLE_FUNCTIONS)
    raise KernelsFeatureError(
        f"variable-size images need tbl-kernels 0.2 or newer ({lacking}) but tbl-kernels "
        f"{getattr(module, '__version__', None)} is installed; fix it with: {need.fix}"
    )


def jpeg_decode_kernels(module: ModuleType | None = None) -> ModuleType | None:
    """The kernels, if they decode JPEG rows inside the batch pass (tbl-kernels 0.3, ABI 4); else None.

    Not a required feature: JPEG storage is served on older kernels too, by decoding whole rows in a
    thread pool (simplejpeg) before the crop-resize call (`tbl_loader.image.variable_source`).
    """
    module = kernels if module is None else module
    if getattr(module, "KERNELS_ABI", 0) < JPEG_DECODE_ABI:
        return None
    if not all(callable(getattr(module, name, None)) for name in JPEG_DECODE_FUNCTIONS):
        return None
    return module


def _load() -> ModuleType:
    try:
        import tbl_kernels
    except ImportError as exc:
        raise ImportError(
            f"tbl-loader needs the compiled kernels ({exc}); install them with: {KERNELS_PIN.fix}"
        ) from exc
    return check_kernels(tbl_kernels)


kernels = _load()
"""The import-time check of the compiled kernels' version and ABI."""
