"""Atomic writes (the file appears whole, with the permissions a plain open() would give it) and the CSV reader."""

from __future__ import annotations

import os
import stat

import pytest

from ampe.errors import InputError
from ampe.io import read_json, write_json_atomic


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
