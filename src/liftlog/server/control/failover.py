"""The asyncio shell of the controller's failover: carries out what ``metadata.failover.FailoverCore`` decides.

Proposals go through the metadata Raft group; log end offset questions go to
each replica's server over NATS (``<prefix><server>.leo``), with a one-second
timeout after which a silent replica is left out. Each result goes back to the
core, which may answer with the next step; the shell runs the steps of one event
one after the other, as the controller loop awaits them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from liftlog.metadata import Metadata, Operation
from liftlog.metadata.failover import AskLogEnds, FailoverAction, FailoverCore, Propose
from liftlog.metadata.protocol import (
    LeaderConfirmation,
    LeaderReport,
    LogEndQuery,
    decode_log_end,
    encode_log_end_query,
)
from liftlog.server.nats.nats_types import NatsClient

__all__ = ["Failover"]

log = logging.getLogger(__name__)

ProposeOperation = Callable[[Operation], Awaitable[object]]
#: How long the controller waits for a replica to say where its log ends.
LOG_END_TIMEOUT_S = 1.0


class Failover:
    def __init__(
        self,
        *,
        metadata: Callable[[], Metadata],
        propose: ProposeOperation,
        nats: NatsClient,
        prefix: str,
        clock: Callable[[], int],
        confirm_timeout_ns: int = 5_000_000_000,
        report_window_ns: int = 15_000_000_000,
        unclean_default: bool = False,
        rebalance_after_ns: int = 10_000_000_000,
    ) -> None:
        self.core = FailoverCore(
            metadata,
            confirm_timeout_ns=confirm_timeout_ns,
            report_window_ns=report_window_ns,
            unclean_default=unclean_default,
            rebalance_after_ns=rebalance_after_ns,
        )
        self._propose = propose
        self._nats = nats
        self._prefix = prefix
        self._clock = clock

    async def report(self, report: LeaderReport) -> None:
        await self._carry_out(self.core.report(report, self._clock()))

    async def confirm(self, confirmation: LeaderConfirmation) -> None:
        await self._carry_out(self.core.confirm(confirmation))

    async def tick(self) -> None:
        await self._carry_out(self.core.tick(self._clock()))

    async def _carry_out(self, actions: list[FailoverAction]) -> None:
        pending = list(actions)
        while pending:
            action = pending.pop(0)
            if isinstance(action, Propose):
                try:
                    result: object = await self._propose(action.op)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NotLeader, a dropped proposal: the core abandons the step
                    result = exc
                pending += self.core.proposed(action, result)
            elif isinstance(action, AskLogEnds):
                leos = await self._log_end_offsets(action)
                pending += self.core.log_ends(action.key, leos, self._clock())

    async def _log_end_offsets(self, action: AskLogEnds) -> dict[str, int]:
        """Ask each replica how far its log goes; silent ones are left out."""
        stream, partition = action.key
        query = encode_log_end_query(LogEndQuery(stream, partition))

        async def ask(replica: str) -> tuple[str, int] | None:
            try:
                reply = await self._nats.request(f"{self._prefix}{replica}.leo", query, timeout=LOG_END_TIMEOUT_S)
                return replica, decode_log_end(reply.data).leo
            except Exception as exc:
                log.debug("partition %s/%d: %s did not say where its log ends: %r", stream, partition, replica, exc)
                return None

        answers = await asyncio.gather(*(ask(r) for r in action.replicas))
        return dict(a for a in answers if a is not None)
