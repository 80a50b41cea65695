from __future__ import annotations

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.policy import describe_policies, make_policy, policy_names


def test_every_policy_names_a_paper_and_a_layer():
    rows = describe_policies()
    assert {r["name"] for r in rows} == set(policy_names())
    for r in rows:
        assert r["paper"] and r["summary"]
        assert r["layer"] in ("retention", "selection", "storage")
    by = {r["name"]: r for r in rows}
    assert by["snapkv"]["params"]["obs_window"] == 32 and by["snapkv"]["params"]["kernel"] == 7
    assert by["streaming"]["params"]["sinks"] == 4
    assert by["quest"]["layer"] == "selection" and by["quant"]["layer"] == "storage"


def test_every_policy_builds_with_defaults():
    for name in policy_names():
        make_policy(name)


def test_unknown_name_and_param_are_one_sentence():
    with pytest.raises(CtxlabError, match="unknown"):
        make_policy("nope")
    with pytest.raises(CtxlabError, match="no parameter"):
        make_policy("h2o", window=3)
