"""Atomic writes (the file appears whole, with the permissions a plain open() would give it) and the CSV reader."""

from __future__ import annotations

import os
import stat

import pytest

from ampe.errors import InputError
from ampe.io import json_text, read_json, write_json_atomic


def test_atomic_json_write_round_trips_with_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "sub" / "plan.json"
        write_json_atomic(path, {"a": [1, 2.5, None]})
        assert read_json(path) == {"a": [1, 2.5, None]}
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600: plans are shared files
        assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no temporary file left behind
    finally:
        os.umask(old)


def test_csv_records_refuse_ambiguity_and_accept_spreadsheet_padding():
    from ampe.io import csv_records

    def rows(text, required=("a", "b")):
        return list(csv_records("f.csv", text, required))

    # a spreadsheet's trailing commas: unnamed columns and empty cells past the header carry nothing
    assert rows("a,b,,\n1,2,,\n3,4\n\n5,6,\n") == [(2, {"a": "1", "b": "2"}), (3, {"a": "3", "b": "4"}),
                                                    (5, {"a": "5", "b": "6"})]
    assert rows(' a , b ,c\n"1,5", 2\n') == [(2, {"a": "1,5", "b": "2"})]  # quoted comma; short row: no c
    for text, field, why in [("a,b,a\n1,2,3\n", "a", "twice"), ("a\n1\n", "b", "missing"),
                             ("a,b\n1,2,3\n", "row 2", "3 cells"), ("a,c,b\n1,2\n", "row 2", "'b'"),
                             ("a,b\n1," + "9" * 200_000 + "\n", "line 2", "field limit")]:
        with pytest.raises(InputError) as e:
            rows(text)
        assert e.value.field == field and why in str(e.value)


def test_json_text_puts_lists_of_numbers_on_one_line_and_round_trips():
    import json

    stage = [["forward", 0, 1410], ["backward", 0, 1200]]
    obj = {"partition": [0, 12, 24], "placement": (3, 1), "devices": [{"id": 0, "gpu": "A100"}], "empty": [],
           "frequency_plan": {"stages": [stage, stage[:1]], "replicas": [{"stages": [stage]}]},
           "mixed": [[], [1, [2]]], "name": "@ampe-json-0", "nested": [[{"a": 1}]]}
    text = json_text(obj)
    assert json.loads(text) == json.loads(json.dumps(obj))
    lines = text.splitlines()
    assert '  "partition": [0, 12, 24],' in lines and '  "placement": [3, 1],' in lines
    assert '      [["forward", 0, 1410], ["backward", 0, 1200]],' in lines  # one stage, one line
    assert '      "id": 0,' in lines  # objects stay indented
    assert json_text(obj, indent=None) == json.dumps(obj)
    with pytest.raises(ValueError):
        json_text({"x": [float("nan")]})
