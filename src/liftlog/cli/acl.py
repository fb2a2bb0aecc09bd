"""``liftlog acl``: the authorization policies kept in the cluster metadata (liftlog servers only)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from rich import box
from rich.table import Table

from liftlog.cli.common import addr_option, connect, run
from liftlog.cli.output import out_console

if TYPE_CHECKING:
    from liftlog.client import Policies

__all__ = ["acl"]


@click.group()
@addr_option
def acl() -> None:
    """Authorization policies: who (a client certificate's identity) may do what on which streams.

    Servers check them with tls.client.authz.enabled; every server enforces the
    same set. Subjects, resources and actions may be `*`; a resource may be a
    glob pattern (`orders.*`). Actions are RPC names: CreateStream, DeleteStream,
    PauseStream, SetStreamReadonly, Subscribe, FetchMetadata (resource `*`),
    FetchPartitionMetadata, Publish, PublishToSubject (resource: the subject),
    and liftlog.Cluster's (Status, Reassign, ..., AddPolicy; resource `*`).

    \b
      liftlog acl add client1 '*' FetchMetadata
      liftlog acl add client1 'orders.*' Publish
      liftlog acl remove client1 'orders.*' Publish
      liftlog acl list
    """


def _rule(subject: str, resource: str, action: str) -> str:
    return f"{subject}, {resource}, {action}"


@acl.command()
@addr_option
@click.argument("subject")
@click.argument("resource")
@click.argument("action")
def add(subject: str, resource: str, action: str) -> None:
    """Let SUBJECT do ACTION on RESOURCE, on every server."""

    async def go() -> None:
        client = connect()
        try:
            await client.add_policy(subject, resource, action)
        finally:
            await client.close()

    run(go())
    out_console().print(f"added: {_rule(subject, resource, action)}")


@acl.command()
@addr_option
@click.argument("subject")
@click.argument("resource")
@click.argument("action")
def remove(subject: str, resource: str, action: str) -> None:
    """Revoke the policy SUBJECT, RESOURCE, ACTION (exactly as it was added)."""

    async def go() -> Policies:
        client = connect()
        try:
            before = await client.list_policies()
            await client.revoke_policy(subject, resource, action)
            return before
        finally:
            await client.close()

    before = run(go())
    if (subject, resource, action) in before.rules:
        out_console().print(f"revoked: {_rule(subject, resource, action)}")
    else:
        out_console().print(f"no such policy: {_rule(subject, resource, action)} (nothing changed)")


@acl.command(name="list")
@addr_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def list_(as_json: bool) -> None:
    """Show the policies the answering server enforces."""

    async def go() -> Policies:
        client = connect()
        try:
            return await client.list_policies()
        finally:
            await client.close()

    policies = run(go())
    if as_json:
        body = {
            "enforced": policies.enforced,
            "from_files": policies.from_files,
            "policies": [{"subject": s, "resource": r, "action": a} for s, r, a in policies.rules],
        }
        click.echo(json.dumps(body))
        return
    console = out_console()
    if not policies.enforced:
        console.print("this server does not enforce policies (tls.client.authz.enabled is off)")
    elif policies.from_files:
        console.print("this server takes its policies from tls.client.authz.policy")
    if not policies.rules:
        console.print("no policies")
        return
    table = Table(box=box.SIMPLE_HEAD, header_style="bold")
    for column in ("SUBJECT", "RESOURCE", "ACTION"):
        table.add_column(column)
    for rule in policies.rules:
        table.add_row(*rule)
    console.print(table)
