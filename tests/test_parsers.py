"""ampe.parsers and ampe.plausible: YAML and JSON counted before they are built, duplicate keys refused with their
line, base-60 numbers read as text, one plausible range per physical quantity."""

from __future__ import annotations

import pytest

from ampe.errors import InputError
from ampe.parsers import MAX_JSON_VALUES, MAX_NESTING, MAX_YAML_NODES, count_yaml, parse_json, parse_yaml
from ampe.plausible import BANDWIDTH_GBPS, ITERATION_S, QUANTITIES


def _laughs(levels: int) -> str:
    """A "billion laughs" YAML: ``levels`` anchors, each a list of nine aliases of the one before (9**levels)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _expanded(levels: int) -> int:
    """Nodes of _laughs(levels) with every alias expanded: per level a list of 9 children, plus each key."""
    size = 10  # a0's list and its nine scalars
    total = 1 + 1 + size  # the root mapping, key a0, a0's list
    for _ in range(1, levels):
        size = 1 + 9 * size
        total += 1 + size
    return total


def test_aliases_are_counted_in_full_and_a_bomb_is_refused_before_it_is_built():
    assert count_yaml(_laughs(3), "f") == _expanded(3)
    assert parse_yaml(_laughs(3), "f")["a2"][8][8] == ["lol"] * 9
    levels = next(n for n in range(2, 20) if _expanded(n) > MAX_YAML_NODES)
    with pytest.raises(InputError, match=r"YAML nodes \(aliases counted in full\)"):
        parse_yaml(_laughs(levels), "f")
    with pytest.raises(InputError, match="YAML nodes"):
        parse_yaml(_laughs(9), "f")  # the classic: 9**9 strings in 342 bytes


def test_nesting_counts_what_aliases_repeat():
    deep = "[" * (MAX_NESTING - 10) + "]" * (MAX_NESTING - 10)
    assert parse_yaml(f"a: &x {deep}\n", "f") is not None
    with pytest.raises(InputError, match="counting what its aliases repeat"):
        parse_yaml(f"a: &x {deep}\nb: {'[' * 20}*x{']' * 20}\n", "f")
    with pytest.raises(InputError, match=f"nested deeper than {MAX_NESTING}"):
        parse_yaml("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1), "f")


def test_duplicate_yaml_keys_are_refused_with_both_lines_but_merge_keys_override():
    with pytest.raises(InputError) as e:
        parse_yaml("a: 1\nb:\n  c: 2\n  c: 3\n", "f.yaml")
    assert str(e.value) == ("f.yaml: line 4: key 'c' appears twice in one mapping (first at line 3); ampe does not "
                            "pick one")
    with pytest.raises(InputError, match=r"key 1\.0 appears twice"):
        parse_yaml("{1: a, 1.0: b}", "f")  # equal as keys: one would silently replace the other
    assert parse_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 5\n", "f")["d"] == {"x": 5, "y": 2}


def test_base_60_numbers_are_text_and_other_numbers_are_unchanged():
    doc = parse_yaml("a: 1:30\nb: 190:20:30.15\nc: [1, 2.5, 0x1f, 1_000, -7, .5, 1e3]\n", "f")
    assert doc == {"a": "1:30", "b": "190:20:30.15", "c": [1, 2.5, 31, 1000, -7, 0.5, "1e3"]}


def test_huge_integers_are_refused_with_their_line():
    with pytest.raises(InputError, match=r"line 2: .*an integer of 5,000 characters"):
        parse_yaml("a: 1\nb: " + "9" * 5000 + "\n", "f")
    with pytest.raises(InputError, match="line 2: an integer of more than 4,000 digits"):
        parse_json('{"a": 1,\n "b": ' + "9" * 5000 + "}", "f")


def test_duplicate_json_keys_are_refused_with_the_line_of_their_object():
    with pytest.raises(InputError) as e:
        parse_json('{"a": 1,\n "b": [\n  {"c": 1, "d": 2},\n  {"c": 1, "c": 2}]}', "f.json")
    assert str(e.value) == "f.json: line 4: key 'c' appears twice in one object; ampe does not pick one"
    assert parse_json('{"a": {"c": 1}, "b": {"c": 2}}', "f") == {"a": {"c": 1}, "b": {"c": 2}}
    with pytest.raises(InputError) as e:  # one JSONL line: its source already names the line
        parse_json('{"a": 1, "a": 2}', "m.jsonl:7")
    assert str(e.value) == "m.jsonl:7: key 'a' appears twice in one object; ampe does not pick one"


def test_json_values_are_counted_before_parsing():
    assert parse_json("[" + ",".join(["0"] * 1000) + "]", "f") == [0] * 1000
    with pytest.raises(InputError, match=f"ampe reads at most {MAX_JSON_VALUES:,}"):
        parse_json("[" + ",".join(["0"] * (MAX_JSON_VALUES + 1)) + "]", "f")


@pytest.mark.parametrize("q", QUANTITIES, ids=[q.name for q in QUANTITIES])
def test_every_quantity_accepts_its_range_and_names_it_outside(q):
    for good in (q.lo, q.hi, (q.lo + q.hi) / 2):
        assert q.problem(good) is None
    for bad in (q.hi * 10 + 1, float("nan"), 1e308, -1e-300 if q.lo == 0 else q.lo / 10):
        why = q.problem(bad)
        assert why is not None and q.text() in why and q.name in why, why
    with pytest.raises(InputError, match=r"f: x: 1e\+308"):
        q.check(1e308, "f", "x")


def test_ranges_read_as_words():
    assert BANDWIDTH_GBPS.text() == "0.001 to 1,000,000 Gbit/s"
    assert ITERATION_S.problem(1e-300) == "1e-300 s is outside 1e-09 to 1,000,000 s (iteration time)"
