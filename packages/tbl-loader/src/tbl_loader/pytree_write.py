"""Writing pytree datasets: one stream of samples, or parts written in parallel and merged.

``write`` is ``tbl_format.Writer`` plus two conveniences: leaves named in
``variable`` are stored as variable-shape arrays (inferred from the first
sample otherwise, every array leaf would be fixed to the first sample's
shape), and torch tensors are accepted anywhere a numpy array is (the format
converts them with ``.numpy()``; torch is never imported here).

``write_parallel(part_fn, n_parts, dst)`` writes part ``i`` from the samples of
``part_fn(i)`` in a pool of processes, each into its own file or directory in a
hidden temporary directory next to ``dst``, then joins them with
``tbl_format.merge_manifests`` (shard files are hard-linked, never rewritten)
and removes the temporary directory. Rows keep part order: all of part 0, then
part 1, ... Nothing is left behind when any part fails.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import tbl_format
from tbl_format import Leaf, Schema

__all__ = ["write", "write_parallel"]


def _with_variable(schema: Schema, variable: Iterable[str]) -> Schema:
    """schema with the named array leaves turned into var_array leaves of the same dtype and ndim."""
    names = list(variable)
    unknown = [p for p in names if p not in schema.leaves]
    if unknown:
        raise KeyError(f"variable names leaves {unknown} that the first sample does not have; it has {list(schema.leaves)}")
    wanted = set(names)

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, Leaf):
            if path not in wanted:
                return node
            if node.kind not in ("array", "var_array"):
                raise ValueError(f"leaf {path!r} is {node.kind}; only array leaves can be variable-shape")
            if node.kind == "var_array":
                return node
            if not node.shape:
                raise ValueError(f"leaf {path!r} is a 0-d array; variable-shape arrays need ndim >= 1")
            return Leaf("var_array", dtype=node.dtype, ndim=len(node.shape))
        if isinstance(node, dict):
            return {k: walk(v, f"{path}/{k}" if path else k) for k, v in node.items()}
        items = [walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)

    return Schema(walk(schema.tree, ""))


def write(
    samples: Iterable[Any],
    dst: str | os.PathLike[str],
    *,
    schema: Schema | Any | None = None,
    variable: Iterable[str] = (),
    metadata: dict[str, Any] | None = None,
    compression: str | None = None,
    shard_rows: int | None = None,
    shard_bytes: int | None = None,
) -> Path:
    """Write every sample to ``dst`` (a ``.tbl`` file, or a directory when ``shard_rows``/``shard_bytes`` is set).

    ``schema``: a ``tbl_format.Schema`` (or its tree of ``Leaf``); inferred from
    the first sample when omitted, with the leaves named in ``variable`` made
    variable-shape. ``compression="lz4"`` compresses variable-size leaves.
    Published atomically; returns ``dst``.
    """
    variable = list(variable)
    if variable and schema is not None:
        raise ValueError("pass either schema or variable: variable only adjusts an inferred schema")
    it = iter(samples)
    if variable:
        try:
            first = next(it)
        except StopIteration:
            raise ValueError("no samples: variable= needs a first sample to infer the schema from") from None
        schema = _with_variable(tbl_format.infer_schema(first), variable)
        it = itertools.chain([first], it)
    kwargs: dict[str, Any] = {"metadata": metadata, "compression": compression}
    if shard_rows is not None:
        kwargs["shard_rows"] = shard_rows
    if shard_bytes is not None:
        kwargs["shard_bytes"] = shard_bytes
    return tbl_format.write(it, dst, schema=schema, **kwargs)


def _write_part(part_fn: Callable[[int], Iterable[Any]], i: int, dst: str, kwargs: dict[str, Any]) -> str:
    try:
        return str(write(part_fn(i), dst, **kwargs))
    except Exception as exc:
        raise RuntimeError(f"part {i} failed: {type(exc).__name__}: {exc}") from exc


def write_parallel(
    part_fn: Callable[[int], Iterable[Any]],
    n_parts: int,
    dst: str | os.PathLike[str],
    *,
    workers: int | None = None,
    mp_context: str = "spawn",
    **write_kwargs: Any,
) -> Path:
    """Write ``n_parts`` parts (``part_fn(i)`` yields part i's samples) in parallel into dataset directory ``dst``.

    ``workers``: processes (default ``min(n_parts, os.cpu_count())``; 0 writes the
    parts one after the other in this process, where ``part_fn`` need not pickle).
    With ``spawn`` (the default) ``part_fn`` must be picklable: a module-level
    function or a ``functools.partial`` of one. Keyword arguments go to
    :func:`write` for every part (give ``schema`` when a part may be empty).
    ``dst`` must not exist yet. Returns ``dst``.
    """
    if isinstance(n_parts, bool) or not isinstance(n_parts, int) or n_parts < 1:
        raise ValueError(f"n_parts must be an int >= 1, got {n_parts!r}")
    dst = Path(dst)
    if dst.exists():
        raise FileExistsError(f"{dst} already exists")
    if not dst.parent.is_dir():
        raise FileNotFoundError(f"destination directory {dst.parent} does not exist")
    if workers is None:
        workers = min(n_parts, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    sharded = write_kwargs.get("shard_rows") is not None or write_kwargs.get("shard_bytes") is not None
    # A hidden name with ".tbl-tmp-" in it, as tbl_format's writer names its temporaries.
    tmp = dst.parent / f".{dst.name}.tbl-tmp-parts-{secrets.token_hex(4)}"
    tmp.mkdir()
    names = [str(tmp / (f"part-{i:05d}" if sharded else f"part-{i:05d}.tbl")) for i in range(n_parts)]
    try:
        if workers == 0:
            parts = [_write_part(part_fn, i, names[i], write_kwargs) for i in range(n_parts)]
        else:
            ctx = multiprocessing.get_context(mp_context)
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = [pool.submit(_write_part, part_fn, i, names[i], write_kwargs) for i in range(n_parts)]
                try:
                    parts = [f.result() for f in futures]
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
        tbl_format.merge_manifests(parts, dst)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst
