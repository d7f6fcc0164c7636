"""The business policy file: each business's terms are the default's with its own over them;
a file that is not one stops the service naming the entry."""

import pytest
from dispo.libs.business_policy import BusinessPolicy, PolicyError, load_policy, parse_policy


def test_a_business_s_weight_is_its_own_or_the_default_s(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "default:\n  weight: 2\nbusinesses:\n  trust-safety:\n    weight: 8\n  bulk: {}\n"
    )
    policy = load_policy(path)
    assert (policy.weight("trust-safety"), policy.weight("bulk"), policy.weight("other")) == (
        8,
        2,
        2,
    )
    assert load_policy("") == BusinessPolicy() and BusinessPolicy().weight("any") == 1


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"businesses": {"bulk": {"weight": 0}}}, "businesses.bulk.weight"),
        ({"businesses": {"bulk": {"weight": True}}}, "businesses.bulk.weight"),
        ({"default": {"weigth": 2}}, "default.weigth"),
        ({"tenants": {}}, "tenants"),
        ({"businesses": ["bulk"]}, "businesses"),
    ],
)
def test_a_bad_policy_names_the_entry(data, named):
    with pytest.raises(PolicyError, match=f"^{named}"):
        parse_policy(data)
