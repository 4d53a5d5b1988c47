"""Every ``--json`` output (and ``loader.stats()``) against its versioned schema in docs/schemas/.

Validated with jsonschema when it is installed; otherwise with the small checker below, which
implements the subset of JSON Schema those files use (type, const, enum, required, properties,
additionalProperties, items, minItems / maxItems, minimum, if / then / else).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tbl_format
from tbl_format.cli import main as tbl_main

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[name])


def _problems(doc, schema: dict, where: str = "$") -> list[str]:
    """The fallback checker: every rule of ``schema`` that ``doc`` breaks."""
    out: list[str] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_type_ok(doc, n) for n in names):
            return [f"{where}: {doc!r} is not of type {names}"]
    if "const" in schema and doc != schema["const"]:
        out.append(f"{where}: {doc!r} != {schema['const']!r}")
    if "enum" in schema and doc not in schema["enum"]:
        out.append(f"{where}: {doc!r} not in {schema['enum']}")
    if "minimum" in schema and _type_ok(doc, "number") and doc < schema["minimum"]:
        out.append(f"{where}: {doc!r} < {schema['minimum']}")
    if isinstance(doc, dict):
        out += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in doc]
        props = schema.get("properties", {})
        for key, value in doc.items():
            if key in props:
                out += _problems(value, props[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{where}: unexpected {key!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += _problems(value, schema["additionalProperties"], f"{where}.{key}")
    if isinstance(doc, list):
        if len(doc) < schema.get("minItems", 0) or len(doc) > schema.get("maxItems", len(doc)):
            out.append(f"{where}: {len(doc)} items")
        if "items" in schema:
            for k, item in enumerate(doc):
                out += _problems(item, schema["items"], f"{where}[{k}]")
    if "if" in schema:
        branch = "then" if not _problems(doc, schema["if"], where) else "else"
        if branch in schema:
            out += _problems(doc, schema[branch], where)
    return out


def check(doc: dict, name: str) -> None:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    assert doc["schema"] == schema["$id"]
    problems = _problems(doc, schema)
    assert problems == [], problems
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(doc, schema)


def _stdout_json(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8)
    samples = [{"image": im, "label": np.int64(i % 3)} for i, im in enumerate(images)]
    return tbl_format.write(samples, tmp_path_factory.mktemp("json") / "ds", shard_rows=10)


def test_every_schema_file_is_valid_json_schema():
    names = sorted(p.stem for p in SCHEMAS.glob("*.json"))
    assert names == ["tbl.convert-1", "tbl.doctor-1", "tbl.inspect-1", "tbl.stats-1", "tbl.verify-1"]
    try:
        import jsonschema
    except ImportError:
        return
    for name in names:
        jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMAS / f"{name}.json").read_text()))


def test_inspect_json(dataset, capsys):
    assert tbl_main(["inspect", str(dataset), "--json"]) == 0
    doc = _stdout_json(capsys)
    check(doc, "tbl.inspect-1")
    assert (doc["rows"], doc["files"], doc["shard_rows"]) == (24, 3, [10, 10, 4])
    assert [leaf["path"] for leaf in doc["leaves"]] == ["image", "label"]
    assert doc["leaves"][0]["shape"] == [8, 8, 3] and doc["leaves"][0]["dtype"] == "uint8"
    assert doc["statistics"] == {"label": {"distinct": 3, "histogram": [[0, 8], [1, 8], [2, 8]]}}
    bad = dict(doc, rows="24")
    assert _problems(bad, json.loads((SCHEMAS / "tbl.inspect-1.json").read_text())) != []  # the check can fail


def test_inspect_statistics_of_variable_images(tmp_path, capsys):
    schema = tbl_format.Schema({"image": tbl_format.Leaf("var_array", dtype="uint8", ndim=3),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    sizes = [(10, 20), (10, 20), (30, 5), (10, 20), (7, 7)]
    with tbl_format.Writer(tmp_path / "var.tbl", schema) as w:
        for i, (h, wd) in enumerate(sizes):
            w.write({"image": np.zeros((h, wd, 3), np.uint8), "height": h, "width": wd, "label": 4 * (i % 2)})
    assert tbl_main(["inspect", str(tmp_path / "var.tbl"), "--json"]) == 0
    doc = _stdout_json(capsys)
    check(doc, "tbl.inspect-1")
    hs, ws = [h for h, _ in sizes], [wd for _, wd in sizes]
    assert doc["statistics"] == {
        "label": {"distinct": 2, "histogram": [[0, 3], [4, 2]]},
        "image_size": {"height": {"min": min(hs), "max": max(hs), "mean": sum(hs) / 5},
                       "width": {"min": min(ws), "max": max(ws), "mean": sum(ws) / 5},
                       "distinct": 3, "most_common": [[10, 20, 3], [30, 5, 1], [7, 7, 1]]}}
    assert tbl_main(["inspect", str(tmp_path / "var.tbl")]) == 0
    text = capsys.readouterr().out
    assert "labels:    0: 3, 4: 2" in text
    assert "sizes:     height 7..30 (mean 13.4), width 5..20 (mean 14.4); 3 distinct HxW, most common 10x20 (3)" in text


def test_verify_json_ok_not_a_dataset_corrupt_unreadable(dataset, tmp_path, capsys):
    assert tbl_main(["verify", str(dataset), "--json"]) == 0
    doc = _stdout_json(capsys)
    check(doc, "tbl.verify-1")
    assert doc["ok"] is True and doc["rows"] == 24

    text = tmp_path / "notes.txt"
    text.write_text("not a dataset\n")
    assert tbl_main(["verify", str(text), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    check(doc, "tbl.verify-1")
    assert doc["error"]["kind"] == "not_a_dataset" and doc["error"]["class"] == "BadMagicError"
    assert "NOT A TBL DATASET" in captured.err and "CORRUPT" not in captured.err

    (tmp_path / "folder").mkdir()
    assert tbl_main(["verify", str(tmp_path / "folder")]) == 1
    assert "NOT A TBL DATASET: NotADatasetError" in capsys.readouterr().err

    broken = tmp_path / "broken.tbl"
    marker = np.full(64, 0x1122334455667788, dtype="<i8")
    tbl_format.write([{"x": marker} for _ in range(4)], broken)
    raw = bytearray(broken.read_bytes())
    raw[raw.index(marker.tobytes()) + 3] ^= 0xFF  # a byte of the data: only the block checksum sees it
    broken.write_bytes(bytes(raw))
    assert tbl_main(["verify", str(broken), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    check(doc, "tbl.verify-1")
    assert doc["error"]["kind"] == "corrupt" and "CORRUPT" in captured.err

    assert tbl_main(["inspect", str(tmp_path / "missing.tbl"), "--json"]) == 2
    doc = _stdout_json(capsys)
    check(doc, "tbl.inspect-1")
    assert doc["error"]["kind"] == "unreadable"


def test_convert_json(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(1)
    for k in range(4):
        folder = tmp_path / "src" / f"class{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    rc = tbl_main(["convert", str(tmp_path / "src"), str(tmp_path / "out.tbl"), "--size", "8", "--workers", "1",
                   "--quiet", "--json"])
    assert rc == 0
    doc = _stdout_json(capsys)
    check(doc, "tbl.convert-1")
    assert (doc["status"], doc["written"], doc["classes"], doc["size"]) == ("ok", 4, 2, 8)


def test_loader_stats(dataset):
    from tbl_loader import ImageLoader

    with ImageLoader(dataset, 5, backend="numpy") as loader:
        list(loader)
        check(loader.stats(), "tbl.stats-1")


def test_doctor_json(dataset, capsys):
    from tbl_bench.doctor import main as doctor_main

    assert doctor_main([str(dataset), "--batch-size", "4", "--seconds", "0.3", "--json", "--quiet"]) == 0
    doc = _stdout_json(capsys)
    check(doc, "tbl.doctor-1")
    assert doc["loader"]["storage"] == "fixed" and doc["measured"]["batches"] > 0
