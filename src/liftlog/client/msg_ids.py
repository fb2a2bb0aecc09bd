"""The message ids this client gives what it publishes (``Nats-Msg-Id``), so that its retries are idempotent.

A liftlog server stores a message whose id it stored already within the
stream's duplicate window at most once, and answers the retry with the
original's offset (``Ack.duplicate``). An id is made before the first
attempt and sent again with every retry. Liftbridge servers store the header
like any other.

Ids are random, not counters: two clients, or one client before and after a
restart, never make the same one: 96 random bits (16 characters). A chunk of
``publish_many`` gets one id for all its records (a hidden ``\x00batch``
header on its first record): per-record ids cost a leader a header read per
record.
"""

from __future__ import annotations

import base64
import os

from liftlog.api.stored import BATCH_ID_HEADER, HIDDEN_MSG_ID_HEADER, MSG_ID_HEADER

__all__ = ["BATCH_ID_HEADER", "HIDDEN_MSG_ID_HEADER", "MSG_ID_HEADER", "new_msg_id"]


def new_msg_id() -> bytes:
    """A fresh random id: 16 URL-safe base64 characters (96 bits)."""
    return base64.urlsafe_b64encode(os.urandom(12))
