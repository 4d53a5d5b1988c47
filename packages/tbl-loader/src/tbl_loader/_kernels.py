"""The compiled kernels this loader was built against, checked at import.

The loader pins ``tbl-kernels`` to one minor series (``KERNELS_REQUIREMENT``, the
same string as in pyproject.toml) and to one binding ABI (``KERNELS_ABI``). A
mismatch fails at import with the installed and required versions and the pip
command that fixes it, instead of failing later inside a kernel call.
"""

from __future__ import annotations

import re
from types import ModuleType

__all__ = ["KERNELS_ABI", "KERNELS_REQUIREMENT", "check_kernels", "kernels"]

KERNELS_REQUIREMENT = "tbl-kernels>=0.1.0,<0.2"
"""The pinned range; pyproject.toml carries the same string (a test checks they agree)."""

KERNELS_ABI = 2
"""The binding ABI this loader calls (tbl_kernels.KERNELS_ABI must equal it)."""

_PIN = re.fullmatch(r"tbl-kernels>=(\d+)\.(\d+)\.(\d+),<(\d+)\.(\d+)", KERNELS_REQUIREMENT)
MIN_VERSION = tuple(int(v) for v in _PIN.group(1, 2, 3))
NEXT_VERSION = tuple(int(v) for v in _PIN.group(4, 5))
FIX_COMMAND = f'pip install "{KERNELS_REQUIREMENT}"'


def _release(version: str) -> tuple[int, ...] | None:
    """The numeric release part of a version string ("0.1.2rc1+local" -> (0, 1, 2)); None if unparsable."""
    m = re.match(r"(\d+(?:\.\d+)*)", str(version))
    return tuple(int(v) for v in m.group(1).split(".")) if m else None


def check_kernels(module: ModuleType) -> ModuleType:
    """Return ``module`` if its version and ABI are the ones this loader supports, else raise ImportError."""
    version = getattr(module, "__version__", None)
    abi = getattr(module, "KERNELS_ABI", None)
    release = _release(version) if version is not None else None
    if release is None or not (MIN_VERSION <= release and release[:2] < NEXT_VERSION):
        raise ImportError(
            f"tbl-loader needs {KERNELS_REQUIREMENT} but tbl-kernels {version} is installed; "
            f"fix it with: {FIX_COMMAND}"
        )
    if abi != KERNELS_ABI:
        raise ImportError(
            f"tbl-loader was built for tbl-kernels ABI {KERNELS_ABI} but the installed tbl-kernels {version} "
            f"has ABI {abi}; fix it with: {FIX_COMMAND}"
        )
    return module


def _load() -> ModuleType:
    try:
        import tbl_kernels
    except ImportError as exc:
        raise ImportError(f"tbl-loader needs the compiled kernels ({exc}); install them with: {FIX_COMMAND}") from exc
    return check_kernels(tbl_kernels)


kernels = _load()
