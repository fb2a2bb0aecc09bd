"""Authorization decisions: may this client identity do this action on this resource?

Casbin (pycasbin) evaluates Liftbridge's ACL model and policies; this module
only feeds it and remembers its answers (a decision costs tens of
microseconds in casbin's evaluator, and a publisher asks for every message).

- **subject**: the client certificate's identity (its common name, else its
  first DNS name), ``*`` in a policy for anyone with a certificate;
- **resource**: a stream name (``*`` for cluster-wide calls such as
  FetchMetadata; the subject for PublishToSubject); a policy may name a glob
  pattern (``orders.*``) or ``*``;
- **action**: the RPC's name as Liftbridge names it (``Publish`` also covers
  PublishAsync and liftlog's batched publish, ``Subscribe`` liftlog's batched
  fetch), ``*`` in a policy for every action.

``root`` may always manage policies (and call FetchMetadata, which every
client does first), so that a cluster cannot lock its administrator out.
Liftbridge's own model file (exact matches only) loads as it is;
:data:`DEFAULT_MODEL` adds the wildcards and patterns above.
"""

from __future__ import annotations

from collections.abc import Iterable

import casbin
from casbin.model import Model

__all__ = ["DEFAULT_MODEL", "POLICY_ACTIONS", "ROOT", "Authorizer", "identity_of"]

DEFAULT_MODEL = """
[request_definition]
r = sub, obj, act

[policy_definition]
p = sub, obj, act

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = (p.sub == "*" || r.sub == p.sub) && (p.obj == "*" || r.obj == p.obj || globMatch(r.obj, p.obj)) \
&& (p.act == "*" || r.act == p.act)
"""

ROOT = "root"
#: The calls that manage policies: always open to ROOT.
POLICY_ACTIONS = frozenset({"AddPolicy", "RevokePolicy", "ListPolicies"})
#: What ROOT may always do: manage policies, and connect (a client's first call is FetchMetadata).
_ROOT_ACTIONS = POLICY_ACTIONS | {"FetchMetadata"}
_CACHE_MAX = 65536


class Authorizer:
    """Decisions for one policy set. Not thread-safe; replace the policies with :meth:`set_policies`."""

    def __init__(self, model_text: str = DEFAULT_MODEL, policies: Iterable[tuple[str, str, str]] = ()) -> None:
        model = Model()
        model.load_model_from_text(model_text)
        self._enforcer = casbin.Enforcer(model)
        self._decisions: dict[tuple[str, str, str], bool] = {}
        #: Whether the policies come from a file (Liftbridge's tls.client.authz.policy), not the metadata.
        self.from_file = False
        self.set_policies(policies)

    @classmethod
    def from_files(cls, model_path: str, policy_path: str) -> Authorizer:
        """Liftbridge's ``tls.client.authz.model`` and ``.policy`` files (casbin's model and CSV policy)."""
        authorizer = cls.__new__(cls)
        authorizer._enforcer = casbin.Enforcer(model_path, policy_path)
        authorizer._decisions = {}
        authorizer.from_file = True
        return authorizer

    def set_policies(self, policies: Iterable[tuple[str, str, str]]) -> None:
        enforcer = self._enforcer
        enforcer.clear_policy()
        rules = [list(p) for p in policies]
        if rules:
            enforcer.add_policies(rules)
        self._decisions.clear()

    def reload_files(self) -> None:
        """Read the policy file again (file mode)."""
        self._enforcer.load_policy()
        self._decisions.clear()

    def policies(self) -> list[tuple[str, str, str]]:
        return [(str(s), str(o), str(a)) for s, o, a, *_ in self._enforcer.get_policy()]

    def allowed(self, subject: str, resource: str, action: str) -> bool:
        key = (subject, resource, action)
        decision = self._decisions.get(key)
        if decision is None:
            if subject == ROOT and action in _ROOT_ACTIONS:
                decision = True
            else:
                decision = bool(subject) and bool(self._enforcer.enforce(subject, resource, action))
            if len(self._decisions) >= _CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision


def identity_of(peercert: dict[str, object] | None) -> str:
    """A client's identity from its verified certificate (``ssl.SSLSocket.getpeercert()``): the subject's
    common name, else its first DNS name; "" without a certificate."""
    if not peercert:
        return ""
    for rdn in peercert.get("subject", ()):  # type: ignore[attr-defined]
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    for kind, value in peercert.get("subjectAltName", ()):  # type: ignore[attr-defined]
        if kind == "DNS":
            return str(value)
    return ""
