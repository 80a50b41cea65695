"""The form's validation: numbers read strictly, every bad field named, nothing crashes."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.lab.api import chart_contexts, plan_response, preset_names
from ctxlab.lab.form import FIELDS_BY_NAME, FormError, gib_to_bytes, parse_form


def test_defaults_are_valid() -> None:
    values = parse_form({}, preset_names())
    assert values["preset"] in preset_names()
    assert values["page_size"] == 16


def test_numbers_accept_separators_and_reject_fractions_of_tokens() -> None:
    values = parse_form({"context": "131,072", "page_size": " 256 "}, preset_names())
    assert values["context"] == 131_072 and values["page_size"] == 256
    with pytest.raises(FormError) as err:
        parse_form({"context": "1.5"}, preset_names())
    assert "whole number" in err.value.errors["context"]


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(FormError) as err:
        parse_form({"context": "x", "concurrency": "0", "reserve_gib": "-1"}, preset_names())
    assert set(err.value.errors) == {"context", "concurrency", "reserve_gib"}


def test_gib_are_binary() -> None:
    assert gib_to_bytes(80) == 80 * 1_073_741_824
    assert gib_to_bytes(0.5) == 536_870_912


def test_chart_contexts_include_the_chosen_length() -> None:
    points = chart_contexts(100_000)
    assert 100_000 in points and points == sorted(points)
    assert points[-1] == 2**18 and len(points) <= 15


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["0", "-1", "1e400", "nan", "inf", "1,0,0", "0x10", "", "   ", "2.0"]),
    st.lists(st.integers(), max_size=2),
)
field_names = st.sampled_from([*FIELDS_BY_NAME, "bogus"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(field_names, junk, max_size=6), st.sampled_from(["preset", "raw"]))
def test_any_input_is_an_answer_never_a_crash(data: dict[str, Any], mode: str) -> None:
    status, body = plan_response({"arch": mode, **data})
    assert status in (HTTPStatus.OK, HTTPStatus.BAD_REQUEST)
    if status == HTTPStatus.BAD_REQUEST:
        assert body["error"]
        assert all(isinstance(msg, str) and msg for msg in body["errors"].values())
    else:
        assert set(body["figures"]) == {"logical", "physical", "prefix_avoided", "page_waste"}
