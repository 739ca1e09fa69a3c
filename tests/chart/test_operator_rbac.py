"""The operator's Role (issue 39): it may read, patch and delete only the ConfigMap and the HPA it
renders for this release, never another object of those kinds in the namespace; create and list, which
RBAC cannot restrict by name, stay open. Checked by evaluating the rendered rules as the API server's
RBAC authorizer does, for every request the operator's client makes (ibex_operator.handlers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from tests.chart.conftest import FULLNAME, Rendered


def allows(
    rules: Sequence[Mapping[str, Any]], verb: str, group: str, resource: str, name: str | None
) -> bool:
    """RBAC's rule match: a rule with resourceNames admits only requests naming one of them (a create or a
    collection list carries no name, so only rules without resourceNames admit it)."""
    for rule in rules:
        if group not in rule["apiGroups"] or resource not in rule["resources"] or verb not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if not names or (name is not None and name in names):
            return True
    return False


CONFIGMAP = ("", "configmaps")
HPA = ("autoscaling", "horizontalpodautoscalers")
# What the operator does to its children (handlers._apply_children, _delete_orphans): get by name, then
# create or merge-patch; list by label; delete the orphans.
OPERATOR_REQUESTS = [
    ("get", CONFIGMAP, f"{FULLNAME}-profiles"),
    ("create", CONFIGMAP, None),
    ("patch", CONFIGMAP, f"{FULLNAME}-profiles"),
    ("list", CONFIGMAP, None),
    ("delete", CONFIGMAP, f"{FULLNAME}-profiles"),
    ("get", HPA, FULLNAME),
    ("create", HPA, None),
    ("patch", HPA, FULLNAME),
    ("list", HPA, None),
    ("delete", HPA, FULLNAME),
]


@pytest.fixture
def operator_rules(render: Callable[..., Rendered]) -> list[Mapping[str, Any]]:
    rules: list[Mapping[str, Any]] = render().one("Role", f"{FULLNAME}-operator")["rules"]
    return rules


@pytest.mark.parametrize(("verb", "kind", "name"), OPERATOR_REQUESTS)
def test_every_request_the_operator_makes_on_its_children_is_allowed(
    operator_rules: list[Mapping[str, Any]], verb: str, kind: tuple[str, str], name: str | None
) -> None:
    assert allows(operator_rules, verb, *kind, name)


@pytest.mark.parametrize("verb", ["get", "patch", "update", "delete"])
@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (CONFIGMAP, "kube-root-ca.crt"),
        (CONFIGMAP, "other-release-ibex-context-profiles"),
        (CONFIGMAP, f"{FULLNAME}-dashboard"),
        (HPA, "another-deployment"),
    ],
)
def test_no_other_configmap_or_hpa_of_the_namespace_can_be_read_changed_or_deleted(
    operator_rules: list[Mapping[str, Any]], verb: str, kind: tuple[str, str], name: str
) -> None:
    assert not allows(operator_rules, verb, *kind, name)


def test_the_names_follow_the_release(render: Callable[..., Rendered]) -> None:
    rules = render(sets=("fullnameOverride=ctx",)).one("Role", "ctx-operator")["rules"]
    assert allows(rules, "patch", *CONFIGMAP, "ctx-profiles")
    assert not allows(rules, "patch", *CONFIGMAP, f"{FULLNAME}-profiles")
    assert allows(rules, "patch", *HPA, "ctx")


def test_extra_services_extend_the_names_and_nothing_else(render: Callable[..., Rendered]) -> None:
    rules = render(sets=("operator.extraServices={ibex-batch}",)).one("Role", f"{FULLNAME}-operator")["rules"]
    for verb in ("get", "patch", "delete"):
        assert allows(rules, verb, *CONFIGMAP, "ibex-batch-profiles")
        assert allows(rules, verb, *HPA, "ibex-batch")
        assert allows(rules, verb, *CONFIGMAP, f"{FULLNAME}-profiles")
        assert not allows(rules, verb, *CONFIGMAP, "ibex-batch")
        assert not allows(rules, verb, *HPA, "ibex-other")
