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


def test_every_registration_line_names_its_class():
    """`REGISTERED` maps a name to "module:Class"; the class must carry that name."""
    from ctxlab.policy.registry import POLICIES, REGISTERED

    assert list(POLICIES) == list(REGISTERED) == policy_names()
    for name in policy_names():
        assert POLICIES[name].name == name
    assert POLICIES.get("nope") is None and "nope" not in POLICIES


def test_package_exports_are_lazy_and_complete():
    import ctxlab.policy as package

    assert set(package.__all__) == set(package._EXPORTS)
    for name in package.__all__:
        assert getattr(package, name) is not None
    with pytest.raises(AttributeError):
        package.NoSuchThing  # noqa: B018


def test_names_and_budgets_are_checked_without_torch():
    """The CLI checks a policy name and a budget before it pays for torch."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import ctxlab.policy\n"
        "from ctxlab.policy import Budget, check_policy_name, policy_names\n"
        "from ctxlab.errors import CtxlabError\n"
        "assert 'snapkv' in policy_names() and Budget.parse('0.5').ratio == 0.5\n"
        "try:\n"
        "    check_policy_name('snapkvv')\n"
        "except CtxlabError:\n"
        "    pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
