"""FFCV, when it imports. It rarely installs (it needs a matching OpenCV, libjpeg-turbo and
a compiler toolchain), so the adapter reports why it is skipped instead of failing the run.
"""

from __future__ import annotations

from tbl_bench.config import SkipConfig

__all__ = ["ffcv_serve", "ffcv_unavailable_reason"]


def ffcv_unavailable_reason() -> str | None:
    """None when ffcv imports, else the reason it does not."""
    try:
        import ffcv  # noqa: F401
        from ffcv.loader import Loader  # noqa: F401
    except Exception as e:  # any import-time failure (missing cv2, ABI mismatch) means "not available"
        return f"ffcv does not import: {type(e).__name__}: {e}"
    return None


def ffcv_serve(**_params):
    """Workload factory. The FFCV writer/loader adapter is not written yet; it is skipped with the reason."""
    reason = ffcv_unavailable_reason()
    if reason is not None:
        raise SkipConfig(reason)
    raise SkipConfig("ffcv imports, but tbl-bench has no FFCV adapter in this version")
