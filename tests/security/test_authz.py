"""Authorization decisions: liftlog's default model, Liftbridge's model and policy files, identities."""

from __future__ import annotations

from pathlib import Path

from liftlog.security.authz import Authorizer, identity_of

#: Liftbridge's documented model (exact matches) and a policy, as docs/security.md shows them.
EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "authz"


def test_default_model_wildcards_and_patterns() -> None:
    a = Authorizer(policies=[("client1", "orders.*", "Publish"), ("*", "*", "FetchMetadata"), ("admin", "*", "*")])
    assert a.allowed("client1", "orders.eu", "Publish")
    assert not a.allowed("client1", "orders.eu", "Subscribe")
    assert not a.allowed("client1", "payments", "Publish")
    assert a.allowed("anyone", "*", "FetchMetadata")
    assert a.allowed("admin", "payments", "DeleteStream")
    assert not a.allowed("", "*", "FetchMetadata")  # no certificate, no identity: nothing, even for `*`


def test_root_may_always_manage_policies_and_connect_and_nothing_else_by_default() -> None:
    a = Authorizer()
    assert a.allowed("root", "*", "AddPolicy") and a.allowed("root", "*", "ListPolicies")
    assert a.allowed("root", "*", "FetchMetadata")
    assert not a.allowed("root", "orders", "Publish")
    assert not a.allowed("client1", "*", "AddPolicy")


def test_a_policy_change_drops_remembered_decisions() -> None:
    a = Authorizer(policies=[("c", "s", "Publish")])
    assert a.allowed("c", "s", "Publish")
    a.set_policies([])
    assert not a.allowed("c", "s", "Publish")
    a.set_policies([("c", "s", "Publish")])
    assert a.allowed("c", "s", "Publish")
    assert a.policies() == [("c", "s", "Publish")]


def test_liftbridge_model_and_policy_files(tmp_path: Path) -> None:
    policy = tmp_path / "policy.csv"
    policy.write_text((EXAMPLES / "policy.csv").read_text())
    a = Authorizer.from_files(str(EXAMPLES / "model.conf"), str(policy))
    assert a.from_file
    assert a.allowed("client1", "*", "FetchMetadata")
    assert a.allowed("client1", "foo", "Subscribe")
    assert not a.allowed("client1", "bar", "Subscribe")  # exact matches only in Liftbridge's model
    assert not a.allowed("client1", "foo", "Publish")
    policy.write_text(policy.read_text() + "p, client2, foo, Publish\n")
    a.reload_files()
    assert a.allowed("client2", "foo", "Publish")


def test_identity_from_a_certificate() -> None:
    cert: dict[str, object] = {
        "subject": ((("countryName", "XX"),), (("commonName", "client1"),)),
        "subjectAltName": (("DNS", "client1.example"),),
    }
    assert identity_of(cert) == "client1"
    assert identity_of({"subject": (), "subjectAltName": (("IP Address", "1.2.3.4"), ("DNS", "a.example"))}) == (
        "a.example"
    )
    assert identity_of(None) == identity_of({}) == ""
