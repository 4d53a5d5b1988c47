from __future__ import annotations

import pytest

from tbl_format import InvalidSchemaError, Leaf, Schema, infer_schema


def test_leaf_validation_names_the_problem():
    with pytest.raises(InvalidSchemaError, match="unknown leaf kind"):
        Leaf("complex")
    with pytest.raises(InvalidSchemaError, match="dtype"):
        Leaf("array", dtype="float128", shape=(2,))
    with pytest.raises(InvalidSchemaError, match="shape"):
        Leaf("array", dtype="float32")
    with pytest.raises(InvalidSchemaError, match=r"\(H, W, C\)"):
        Leaf("image", shape=(32, 32))
    with pytest.raises(InvalidSchemaError, match="ndim"):
        Leaf("var_array", dtype="int32")
    with pytest.raises(InvalidSchemaError, match="format"):
        Leaf("encoded_image")
    with pytest.raises(InvalidSchemaError, match="takes no dtype"):
        Leaf("int", dtype="int64")
    assert Leaf("image", shape=(4, 5, 3)).dtype == "uint8"
    assert Leaf("image", shape=[4, 5, 3]).row_bytes == 60


def test_paths_and_json_round_trip():
    s = Schema({
        "image": Leaf("image", shape=(8, 8, 3)),
        "meta": {"caption": Leaf("str"), "boxes": [Leaf("var_array", dtype="float32", ndim=2), (Leaf("int"),)]},
        "jpeg": Leaf("encoded_image", format="jpeg"),
    })
    assert s.paths == ["image", "meta/caption", "meta/boxes/0", "meta/boxes/1/0", "jpeg"]
    back = Schema.from_json(s.to_json())
    assert back == s and back.fingerprint == s.fingerprint
    assert isinstance(back.tree["meta"]["boxes"], list) and isinstance(back.tree["meta"]["boxes"][1], tuple)
    assert Schema({"a": Leaf("int")}) != Schema({"a": Leaf("float")})


def test_keys_with_slash_or_empty_rejected():
    with pytest.raises(InvalidSchemaError, match="'/'"):
        infer_schema({"a/b": 1})
    with pytest.raises(InvalidSchemaError):
        Schema({"": Leaf("int")})
    with pytest.raises(InvalidSchemaError, match="keys must be str"):
        infer_schema({1: 1})


def test_from_json_rejects_garbage():
    for bad in [None, [], {"leaf": 3}, {"dict": [["a"]]}, {"set": []}, {"dict": [["a", {"leaf": {"kind": "int"}}]] * 2},
                {"leaf": {"kind": ["x"]}}, {"leaf": {"kind": "array", "dtype": "uint8", "shape": [-1]}}]:
        with pytest.raises(InvalidSchemaError):
            Schema.from_json(bad)


def test_infer_scalars_and_nesting():
    s = infer_schema({"i": 1, "f": 1.5, "b": True, "s": "x", "y": b"x", "l": [1, (2.0, "z")]})
    kinds = {p: leaf.kind for p, leaf in s.leaves.items()}
    assert kinds == {"i": "int", "f": "float", "b": "bool", "s": "str", "y": "bytes",
                     "l/0": "int", "l/1/0": "float", "l/1/1": "str"}
    with pytest.raises(InvalidSchemaError, match="cannot store a object"):
        infer_schema({"x": object()})


def test_infer_numpy_and_torch():
    np = pytest.importorskip("numpy")
    s = infer_schema({"a": np.zeros((2, 3), np.float16), "n": np.int32(3), "g": np.float32(1), "q": np.bool_(True)})
    assert s.leaves["a"] == Leaf("array", dtype="float16", shape=(2, 3))
    assert [s.leaves[k].kind for k in "ngq"] == ["int", "float", "bool"]
    torch = pytest.importorskip("torch")
    assert infer_schema(torch.zeros(4, dtype=torch.uint8)).leaves[""] == Leaf("array", dtype="uint8", shape=(4,))
