"""tbl_bench.remote's bookkeeping: the configurations, the per-round ratios and the server's byte counter."""

from __future__ import annotations

import pytest

from tbl_bench import remote


def test_every_configuration_once_and_litdata_only_where_it_has_the_shuffle():
    configs = remote._configs()
    assert configs[0] == ("TBL local", None, "block") and len(set(configs)) == len(configs)
    assert {(s, f, sh) for s, f, sh in configs if s == "litdata"} == {("litdata", f, "block")
                                                                      for f in remote.FRACTIONS}
    assert {(f, sh) for s, f, sh in configs if s == "Mosaic"} == {(f, sh) for f in remote.FRACTIONS
                                                                  for sh in remote.SHUFFLES}


def test_ratios_are_against_the_best_peer_of_the_same_round_and_skip_failures():
    results = {("TBL", 1.0, "block"): {"cold": 300.0, "second": 900.0, "cold_bytes": 1},
               ("Mosaic", 1.0, "block"): {"cold": 100.0, "second": 300.0, "cold_bytes": 1},
               ("litdata", 1.0, "block"): {"cold": 200.0, "second": 450.0, "cold_bytes": 1},
               ("TBL local", None, "block"): {"cold": 500.0, "second": 1000.0, "cold_bytes": 0},
               ("Mosaic", 0.3, "block"): "failed: ValueError: too small"}
    assert remote._row_ratios(results, 1.0, "block") == {"cold": pytest.approx(1.5), "second": pytest.approx(2.0),
                                                          "local": pytest.approx(0.9)}
    assert remote._row_ratios(results, 0.3, "block") == {}  # no TBL figure in that row
    results[("TBL", 0.3, "block")] = {"cold": 10.0, "second": 20.0, "cold_bytes": 1}
    assert remote._row_ratios(results, 0.3, "block") == {"local": pytest.approx(0.02)}  # the peer failed


def test_the_byte_counter_counts_get_bodies_only_and_answers_its_count():
    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"abc", b"defg"]

    counter = remote._ByteCounter(app)
    calls = []
    assert b"".join(counter({"PATH_INFO": "/b/k", "REQUEST_METHOD": "GET"}, lambda *a: calls.append(a))) == b"abcdefg"
    assert b"".join(counter({"PATH_INFO": "/b/k", "REQUEST_METHOD": "PUT"}, lambda *a: calls.append(a))) == b"abcdefg"
    assert counter.sent == 7
    assert b"".join(counter({"PATH_INFO": remote.COUNTER_PATH}, lambda *a: calls.append(a))) == b"7"
