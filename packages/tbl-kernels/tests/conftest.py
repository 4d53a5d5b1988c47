import numpy as np
import pytest

import tbl_kernels as tk


@pytest.fixture(params=tk.simd_levels())
def simd(request):
    """Run a test once per instruction-set level, restoring the automatic choice after."""
    tk.set_simd(request.param)
    yield request.param
    tk.set_simd("auto")


@pytest.fixture(params=[1, 2])
def threads(request):
    before = tk.get_num_threads()
    tk.set_num_threads(request.param)
    yield request.param
    tk.set_num_threads(before)


def all_values_images(rng: np.random.Generator, n: int, h: int, w: int, c: int) -> np.ndarray:
    """Random images in which every byte value appears in every channel (h * w >= 256)."""
    assert h * w >= 256
    imgs = rng.integers(0, 256, size=(n, h * w, c), dtype=np.uint8)
    for i in range(n):
        for ch in range(c):
            pos = rng.permutation(h * w)[:256]
            imgs[i, pos, ch] = np.arange(256, dtype=np.uint8)
    return imgs.reshape(n, h, w, c)


def split_sources(images: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split along axis 0 into 2-3 segments (an empty one included sometimes)."""
    n = len(images)
    cuts = sorted(rng.integers(0, n + 1, size=int(rng.integers(1, 3))).tolist())
    return [np.ascontiguousarray(s) for s in np.split(images, cuts)]
