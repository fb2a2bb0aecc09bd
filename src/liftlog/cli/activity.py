"""``liftlog activity``: the cluster's activity stream, one readable line per event."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from liftlog.cli.common import addr_option, connect, fail, run

__all__ = ["activity", "describe_event"]


def describe_event(data: bytes) -> dict[str, Any]:
    """An ``ActivityStreamEvent`` as a dict: id, op name and its fields (``{"id": None, ...}`` if undecodable)."""
    from google.protobuf.json_format import MessageToDict

    from liftlog.api import api_pb2

    event = api_pb2.ActivityStreamEvent()
    try:
        event.ParseFromString(data)
    except Exception:  # protobuf's DecodeError: a value that is not an event
        return {"id": None, "op": "UNDECODABLE", "bytes": len(data)}
    op = api_pb2.ActivityStreamOp.Name(event.op)
    field = {
        "CREATE_STREAM": "createStreamOp",
        "DELETE_STREAM": "deleteStreamOp",
        "PAUSE_STREAM": "pauseStreamOp",
        "RESUME_STREAM": "resumeStreamOp",
        "SET_STREAM_READONLY": "setStreamReadonlyOp",
        "JOIN_CONSUMER_GROUP": "joinConsumerGroupOp",
        "LEAVE_CONSUMER_GROUP": "leaveConsumerGroupOp",
    }.get(op)
    body = MessageToDict(getattr(event, field), preserving_proto_field_name=True) if field else {}
    return {"id": event.id, "op": op, **body}


def _line(event: dict[str, Any]) -> str:
    details = " ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in event.items() if k not in ("id", "op")
    )
    return f"#{event['id']}  {event['op']:<20} {details}".rstrip()


@click.command()
@addr_option
@click.option(
    "--from",
    "start",
    type=click.Choice(["earliest", "new"]),
    default="earliest",
    show_default=True,
    help="Start at the first event kept, or only show new ones.",
)
@click.option("-f", "--follow/--no-follow", default=False, help="Keep waiting for new events until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
def activity(start: str, follow: bool, as_json: bool) -> None:
    """Show the cluster's activity stream: streams created, deleted, paused, resumed, set readonly.

    Servers publish it to __activity when activity.stream.enabled is on. Each
    event has the id of the metadata change it reports, increasing; after a
    controller failover an event may repeat (same id): it is shown once.

    \b
      liftlog activity
      liftlog activity --from new --follow
    """
    from liftlog.client import NoSuchStreamError, StartPosition, StopPosition

    async def go() -> None:
        seen = 0
        async with connect() as client:
            sub = client.subscribe(
                "__activity",
                start_position=StartPosition.EARLIEST if start == "earliest" else StartPosition.NEW_ONLY,
                stop_position=StopPosition.STOP_ON_CANCEL if follow else StopPosition.STOP_LATEST,
            )
            async with sub:
                async for msg in sub:
                    event = describe_event(msg.value)
                    if event["id"] is not None and event["id"] <= seen:
                        continue  # republished by a new controller
                    seen = event["id"] or seen
                    sys.stdout.write((json.dumps(event) if as_json else _line(event)) + "\n")
                    if follow:
                        sys.stdout.flush()

    async def or_say_why() -> None:
        try:
            await go()
        except NoSuchStreamError:
            fail(
                "the activity stream is off on this cluster: start the servers with "
                "--set activity.stream.enabled=true (the metadata leader creates __activity then)"
            )

    run(or_say_why())
