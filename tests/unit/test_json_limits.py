"""databus._json.loads_bounded: the one parser for JSON that clients send."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus._http import json_response
from databus._json import MAX_DEPTH, JsonLimitError, dumps, finite, loads_bounded

values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10)


@given(values)
def test_ordinary_json_reads_as_json_loads_reads_it(value: object) -> None:
    text = json.dumps(value)
    assert loads_bounded(text) == json.loads(text)
    assert loads_bounded(text.encode()) == json.loads(text)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=60), st.binary(max_size=60),
                 st.text(alphabet='[]{}"\\:,1a ', max_size=80)))
def test_any_text_is_a_value_or_a_json_limit_error(text: str | bytes) -> None:
    """Only JsonLimitError escapes; what it accepts, json.loads reads the same."""
    try:
        got = loads_bounded(text)
    except JsonLimitError:
        return
    assert got == json.loads(text)


@pytest.mark.parametrize("text", [
    "[" * 1500, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), '{"a":' * 100 + "1" + "}" * 100,
    "9" * 5000, "[" + "9" * 41 + "]", "-" + "9" * 41, "NaN", "[Infinity]", "-Infinity",
    '{"a": 1, "a": 1}', b"\xff", "x" * 300_000, "",
])
def test_limits(text: str | bytes) -> None:
    with pytest.raises(JsonLimitError) as info:
        loads_bounded(text)
    assert len(str(info.value)) < 300


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"key": "[" * 5000, "k2": '\\"[[[' * 100})
    assert loads_bounded(text) == json.loads(text)
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads_bounded(nested) == json.loads(nested)
    assert loads_bounded("9" * 40) == int("9" * 40)


# -- writing: dumps never writes NaN or Infinity (issue 27, item 11) ---------------------

any_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64), st.floats(),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10)


def _names(value: object) -> object:
    """What ``dumps`` promises to write, built independently."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _names(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_names(v) for v in value]
    return value


@given(any_values)
def test_dumps_writes_strict_json_with_non_finite_floats_named(value: object) -> None:
    text = dumps(value)
    assert loads_bounded(text, max_depth=64) == _names(value)  # refuses NaN constants
    if _names(value) == json.loads(json.dumps(value)):  # nothing to name: json.dumps's text
        assert text == json.dumps(value)


def test_dumps_names_and_http_answers_use_it() -> None:
    doc = {"nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"), "x": 1.5}
    assert dumps(doc) == '{"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "x": 1.5}'
    assert (finite(float("nan")), finite(2.0)) == ("NaN", 2.0)
    answer = json_response(doc)
    assert isinstance(answer.body, bytes)
    assert loads_bounded(answer.body) == {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity",
                                          "x": 1.5}
    with pytest.raises(ValueError, match="Circular"):
        loop: list[object] = []
        loop.append(loop)
        dumps(loop)
