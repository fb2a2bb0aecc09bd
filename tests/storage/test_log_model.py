"""Model-based property tests of the storage engine.

``CommitLogMachine`` drives a real ``CommitLog`` (small segments and index
intervals, so that rolls, index entries, retention and compaction all happen
within a few steps) and a plain in-memory model side by side, and checks
after every step that the two agree. The codec gets two focused properties
of its own: encode/decode roundtrips and prefix-safe batch iteration.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Literal

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from liftlog.storage import (
    CommitLog,
    InvalidBatch,
    LogConfig,
    NewRecord,
    NonMonotonicOffset,
    OffsetOutOfRange,
    Record,
    StaleLeaderEpoch,
)
from liftlog.storage.records import (
    decode_records,
    encode_batch,
    iter_batch_headers,
    record_keys,
    retain_records,
)

# fsync-heavy paths (rolls, checkpoints) are much cheaper on tmpfs when there is one.
_FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
_START_NS = 1_700_000_000_000_000_000
_MS = 1_000_000

# (offset, timestamp, key, value, headers): what a Record holds, comparable with ==.
Row = tuple[int, int, bytes | None, bytes, dict[str, bytes]]


def row(record: Record) -> Row:
    return (record.offset, record.timestamp, record.key, record.value, dict(record.headers))


class Clock:
    """Injectable wall clock (ns) that only moves when the machine says so."""

    def __init__(self) -> None:
        self.now = _START_NS

    def __call__(self) -> int:
        return self.now


# -- strategies ---------------------------------------------------------------

# Record contents come from a seeded generator so that one rule draws a handful of choices, not
# hundreds: Hypothesis stops a run early once its buffer of choices fills, and long runs are what
# get many segments, index entries and retention/compaction work. Mostly small batches, so that
# several batches share an index entry.
record_lists = st.tuples(st.sampled_from([1, 1, 1, 2, 3, 5, 8, 20]), st.integers(0, 2**32 - 1))
_KEYS: list[bytes | None] = [None, None, b"", b"a", b"b", b"c"]  # tiny key space: compaction has work
_HEADER_NAMES = ["h", "subject", "\u00e9t\u00e9", ""]
epoch_bumps = st.sampled_from([0, 0, 0, 0, 1, 2])
picks = st.integers(min_value=0, max_value=2**32)


class CommitLogMachine(RuleBasedStateMachine):
    """A CommitLog against a dict of surviving records plus its offsets and epoch cache."""

    def __init__(self) -> None:
        super().__init__()
        self.dir: str | None = None
        self.log: CommitLog | None = None
        self.clock = Clock()
        self.config = LogConfig()
        # the model
        self.records: dict[int, tuple[int, bytes | None, bytes, dict[str, bytes]]] = {}
        self.start = 0
        self.leo = 0
        self.hw = -1
        self.epochs: list[tuple[int, int]] = []
        self.epoch = 0  # newest epoch the machine has written with (never decreases)

    # -- helpers -----------------------------------------------------------

    @property
    def L(self) -> CommitLog:  # short on purpose: used in every rule
        assert self.log is not None
        return self.log

    def rows(self, lo: int | None = None, hi: int | None = None) -> list[Row]:
        lo = self.start if lo is None else lo
        hi = self.leo if hi is None else hi
        return [(o, *self.records[o]) for o in sorted(self.records) if lo <= o < hi]

    def new_records(self, spec: tuple[int, int]) -> list[NewRecord]:
        """``count`` records from ``seed``: small keys or None, some headers, some explicit timestamps."""
        count, seed = spec
        rng = random.Random(seed)
        out = []
        for _ in range(count):
            key = rng.choice(_KEYS)
            value = rng.randbytes(rng.randint(0, 48))
            headers: dict[str, bytes] = {}
            if rng.random() < 0.25:
                headers = {
                    rng.choice(_HEADER_NAMES): rng.randbytes(rng.randint(0, 8)) for _ in range(rng.randint(1, 3))
                }
            ts = None
            if rng.random() < 0.4:  # explicit, out of order, within a few seconds of the clock
                ts = max(0, self.clock.now + rng.randint(-3_000, 3_000) * _MS)
            out.append(NewRecord(value, key, headers, ts))
        return out

    def model_add(self, base: int, records: list[NewRecord], default_ts: int) -> None:
        for i, r in enumerate(records):
            ts = default_ts if r.timestamp is None else r.timestamp
            self.records[base + i] = (ts, r.key, r.value, dict(r.headers))

    def model_assign_epoch(self, epoch: int, start: int) -> None:
        """LeaderEpochCache.assign as the log uses it (only for a new, larger epoch)."""
        if self.epochs and epoch <= self.epochs[-1][0]:
            return
        while self.epochs and (self.epochs[-1][0] >= epoch or self.epochs[-1][1] >= start):
            self.epochs.pop()
        self.epochs.append((epoch, start))

    def model_set_start(self, start: int) -> None:
        self.start = start
        for o in [o for o in self.records if o < start]:
            del self.records[o]
        below = [e for e in self.epochs if e[1] <= start]
        if below and not (len(below) == 1 and below[0][1] == start):
            self.epochs = [(below[-1][0], start)] + [e for e in self.epochs if e[1] > start]

    def clamp_hw(self) -> None:
        self.hw = max(min(self.hw, self.leo - 1), self.start - 1)

    def open(self) -> None:
        assert self.dir is not None
        self.log = CommitLog.open(self.dir, self.config, clock=self.clock)

    def pick_offset(self, pick: int) -> int:
        """An offset in [start, LEO]: half the time one that holds a record (gaps can be wide)."""
        if pick % 2 and self.records:
            held = sorted(self.records)
            return held[pick // 2 % len(held)]
        return self.start + pick // 2 % (self.leo - self.start + 1)

    # -- setup and teardown -----------------------------------------------

    @initialize(
        segment_max_bytes=st.integers(512, 3000),
        index_interval_bytes=st.integers(64, 512),
        segment_max_age_ms=st.sampled_from([0, 0, 0, 300]),
    )
    def setup(self, segment_max_bytes: int, index_interval_bytes: int, segment_max_age_ms: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="liftlog-model-", dir=_FAST_TMP)
        self.config = LogConfig(
            segment_max_bytes=segment_max_bytes,
            index_interval_bytes=index_interval_bytes,
            segment_max_age_ms=segment_max_age_ms,
        )
        self.open()

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writing rules -------------------------------------------------------

    @rule(spec=record_lists, bump=epoch_bumps)
    def append(self, spec: tuple[int, int], bump: int) -> None:
        records = self.new_records(spec)
        self.epoch += bump
        base = self.leo
        assert self.L.append(records, leader_epoch=self.epoch) == base + len(records)
        self.model_assign_epoch(self.epoch, base)
        self.model_add(base, records, self.clock.now)
        self.leo = base + len(records)
        self.clock.now += _MS  # time passes between appends: newer batches tend to hold newer records

    @rule(
        batches=st.lists(
            st.tuples(st.sampled_from([0, 0, 0, 1, 3, 17, 1 << 20]), record_lists), min_size=1, max_size=3
        ),
        bump=epoch_bumps,
    )
    def append_raw(self, batches: list[tuple[int, tuple[int, int]]], bump: int) -> None:
        """Batches from "a leader": encoded elsewhere, base offsets >= LEO, sometimes after a gap."""
        self.epoch += bump
        now = self.clock.now
        data = b""
        base = self.leo
        encoded: list[tuple[int, list[NewRecord]]] = []
        for gap, spec in batches:
            base += gap
            records = self.new_records(spec)
            data += encode_batch(base, self.epoch, records, now)
            encoded.append((base, records))
            base += len(records)
        assert self.L.append_raw(data) == base
        event("append_raw: " + ("with a gap" if any(g for g, _ in batches) else "contiguous"))
        first = encoded[0][0]
        if self.leo == self.start and first != self.leo:
            # an empty log is renamed for the first offset it gets: the log start moves with it
            self.model_set_start(first)
        for b, records in encoded:
            self.model_assign_epoch(self.epoch, b)
            self.model_add(b, records, now)
        self.leo = base
        self.clamp_hw()
        self.clock.now += _MS

    @precondition(lambda self: self.leo > 0)
    @rule(pick=picks, spec=record_lists)
    def append_raw_below_leo_is_refused(self, pick: int, spec: tuple[int, int]) -> None:
        base = pick % self.leo
        data = encode_batch(base, self.epoch, self.new_records(spec), self.clock.now)
        with pytest.raises(NonMonotonicOffset):
            self.L.append_raw(data)

    @rule(spec=record_lists, pick=picks)
    def append_raw_with_bad_crc_is_refused(self, spec: tuple[int, int], pick: int) -> None:
        data = bytearray(encode_batch(self.leo, self.epoch, self.new_records(spec), self.clock.now))
        data[21 + pick % (len(data) - 21)] ^= 0x40
        with pytest.raises(InvalidBatch):
            self.L.append_raw(bytes(data))

    @precondition(lambda self: bool(self.epochs) and self.epochs[-1][0] > 0)
    @rule(spec=record_lists)
    def stale_epoch_is_refused(self, spec: tuple[int, int]) -> None:
        with pytest.raises(StaleLeaderEpoch):
            self.L.append(self.new_records(spec), leader_epoch=self.epochs[-1][0] - 1)

    @rule(pick=picks)
    def truncate_to(self, pick: int) -> None:
        if pick % 3 == 0:  # at or just after a segment boundary
            bases = [s.base_offset for s in self.L.segments]
            offset = min(bases[pick // 3 % len(bases)] + pick // 3 % 2, self.leo)
        else:
            offset = self.pick_offset(pick)
        note(f"truncate_to({offset}) with segments {self.L.segments}")
        self.L.truncate_to(offset)
        event(
            "truncate_to: "
            + ("no-op" if offset >= self.leo else "inside a gap" if offset not in self.records else "at a record")
        )
        if offset < self.leo:
            for o in [o for o in self.records if o >= offset]:
                del self.records[o]
            self.leo = offset
            self.epochs = [e for e in self.epochs if e[1] < offset]
        self.clamp_hw()

    @rule(reopen=st.booleans())
    def roll(self, reopen: bool) -> None:
        self.L.roll()
        if reopen:  # closed segments are loaded from their indexes, not rebuilt
            self.close_and_reopen()

    @rule(ms=st.integers(0, 500))
    def advance_clock(self, ms: int) -> None:
        self.clock.now += ms * _MS

    @rule(
        kind=st.sampled_from(["bytes", "messages", "age"]),
        limit=st.integers(1, 6000),
    )
    def enforce_retention(self, kind: str, limit: int) -> None:
        log = self.L
        before = [(s.base_offset, s.next_offset, s.size) for s in log.segments]
        if kind == "bytes":
            cfg = replace(self.config, retention_max_bytes=limit)
        elif kind == "messages":
            cfg = replace(self.config, retention_max_messages=limit % 300 + 1)
        else:
            cfg = replace(self.config, retention_max_age_ms=limit % 3000 + 1)
        # Retention limits are only read by enforce_retention: swap them in for this call.
        log.config = cfg
        try:
            deleted = log.enforce_retention()
        finally:
            log.config = self.config
        new_start = log.log_start_offset
        event(f"retention by {kind}: {'deleted' if deleted else 'kept'} segments")
        note(f"retention {cfg} deleted {deleted} of {before}; start {self.start} -> {new_start}")
        if deleted:
            assert new_start == before[deleted][0], "the log start must be the first remaining segment's base"
        else:
            assert new_start == self.start
        assert self.start <= new_start <= self.leo
        assert [s.base_offset for s in log.segments] == [b[0] for b in before[deleted:]]
        gone = [r for r in self.rows() if r[0] < new_start]
        segs = log.segments
        if kind == "bytes":
            if deleted:
                assert log.size_bytes >= cfg.retention_max_bytes
            if len(segs) > 1:
                assert log.size_bytes - segs[0].size < cfg.retention_max_bytes
        elif kind == "messages":
            if deleted:
                assert self.leo - new_start >= cfg.retention_max_messages
            if len(segs) > 1:
                assert self.leo - segs[1].base_offset < cfg.retention_max_messages
        else:
            cutoff = self.clock.now - cfg.retention_max_age_ms * _MS
            assert all(r[1] < cutoff for r in gone), "retention by age deleted a record newer than the limit"
        self.model_set_start(new_start)
        self.clamp_hw()

    @rule(pick=picks, overshoot=st.booleans())
    def compact(self, pick: int, overshoot: bool) -> None:
        log = self.L
        hw = self.leo + 5 if overshoot else self.start - 1 + pick % (self.leo - self.start + 1)
        log.set_high_watermark(hw)
        self.hw = hw
        self.clamp_hw()
        assert log.high_watermark == self.hw
        bound = self.hw + 1
        # Candidates: closed segments wholly at or below the high watermark.
        ranges = [(s.base_offset, s.next_offset) for s in log.segments[:-1] if s.next_offset <= bound]
        latest: dict[bytes, int] = {}
        for o in sorted(self.records):
            key = self.records[o][1]
            if o < bound and key is not None:
                latest[key] = o
        doomed = [
            o
            for o, (_ts, key, _v, _h) in self.records.items()
            if key is not None and any(lo <= o < hi for lo, hi in ranges) and latest[key] != o
        ]
        result = log.compact()
        event(f"compact: {'removed records' if result.records_removed else 'nothing removed'}")
        note(f"compact below {bound}: ranges {ranges}, removed {sorted(doomed)}, result {result}")
        assert result.records_removed == len(doomed)
        for o in doomed:
            del self.records[o]
        assert log.high_watermark == self.hw

    @rule()
    def close_and_reopen(self) -> None:
        self.L.close()
        self.log = None
        self.open()
        event(f"reopen with {min(len(self.L.segments), 5)}{'+' if len(self.L.segments) >= 5 else ''} segments")
        # Recovery trims the epoch cache to the log's offset range [start, LEO) (storage-format.md,
        # "Recovery at open"). Retention can leave an entry starting at the LEO itself when it
        # deletes every record; that entry does not survive a reopen.
        self.epochs = [e for e in self.epochs if e[1] < self.leo]

    @rule(pick=picks)
    def crash_with_a_torn_tail(self, pick: int) -> None:
        """Close, cut the active segment's file at a byte, reopen: only its whole batches survive."""
        active = self.L.active_segment
        base, path = active.base_offset, active.log_path
        segments = self.L.segments
        previous_end = segments[-2].next_offset if len(segments) > 1 else base
        self.L.close()
        self.log = None
        data = path.read_bytes()
        cut = pick % (len(data) + 1)
        whole = list(iter_batch_headers(data[:cut]))
        os.truncate(path, cut)
        # An emptied segment that began after a gap is dropped: the LEO is then the previous segment's end.
        leo = whole[-1].next_offset if whole else min(base, previous_end)
        end = whole[-1].position + whole[-1].size if whole else 0
        event("torn tail: " + ("on a batch boundary" if cut == end else "inside a batch"))
        for o in [o for o in self.records if o >= leo]:
            del self.records[o]
        self.leo = leo
        self.clamp_hw()
        self.open()
        self.epochs = [e for e in self.epochs if e[1] < self.leo]

    @rule(pick=picks, mode=st.sampled_from(["delete", "truncate", "garbage"]))
    def damage_an_index_and_reopen(self, pick: int, mode: str) -> None:
        """Close, damage one .index or .timeindex file, reopen: nothing a reader sees changes."""
        assert self.dir is not None
        self.L.close()
        self.log = None
        files = sorted(p for p in Path(self.dir).iterdir() if p.suffix in (".index", ".timeindex"))
        path = files[pick % len(files)] if files else None  # only sealed segments have index files
        if path is None:
            pass
        elif mode == "delete":
            path.unlink()
        elif mode == "truncate":
            path.write_bytes(path.read_bytes()[: pick // 7 % (path.stat().st_size + 1)])
        else:
            path.write_bytes(random.Random(pick).randbytes(pick % 50))
        self.open()
        self.epochs = [e for e in self.epochs if e[1] < self.leo]

    # -- reading rules ---------------------------------------------------------

    @rule(pick=picks, max_records=st.integers(1, 50), max_bytes=st.sampled_from([1, 100, 1000, 1 << 20]))
    def read(self, pick: int, max_records: int, max_bytes: int) -> None:
        offset = self.pick_offset(pick)
        got = [row(r) for r in self.L.read(offset, max_records=max_records, max_bytes=max_bytes)]
        expected = self.rows(offset)
        assert len(got) <= max_records
        assert got == expected[: len(got)]
        if max_bytes == 1 << 20:
            assert got == expected[:max_records]

    @rule(pick=picks, pick_end=picks, max_records=st.integers(1, 50))
    def read_with_max_offset(self, pick: int, pick_end: int, max_records: int) -> None:
        offset = self.pick_offset(pick)
        end = max(offset, self.pick_offset(pick_end)) + pick_end % 3  # sometimes past the LEO
        got = [row(r) for r in self.L.read(offset, max_records=max_records, max_offset=end)]
        assert got == self.rows(offset, min(end, self.leo))[:max_records]

    @rule(pick=picks, max_bytes=st.sampled_from([1, 64, 500, 4096, 1 << 20]))
    def read_raw(self, pick: int, max_bytes: int) -> None:
        offset = self.pick_offset(pick)
        data = self.L.read_raw(offset, max_bytes=max_bytes)
        if offset == self.leo:
            assert data == b""
            return
        headers = list(iter_batch_headers(data, verify=True))
        assert headers, f"read_raw({offset}) below the LEO {self.leo} returned no batch"
        assert headers[-1].position + headers[-1].size == len(data), "read_raw returned a partial batch"
        assert headers[0].next_offset > offset, "the first batch must hold the offset or come after it"
        if len(headers) > 1:
            assert len(data) <= max(max_bytes, headers[0].size)
        decoded = [row(r) for h in headers for r in decode_records(data, h)]
        assert [r[0] for r in decoded] == sorted({r[0] for r in decoded})
        for r in decoded:
            assert r[0] in self.records and (r[0], *self.records[r[0]]) == r
        # nothing the model holds in the range covered by the batches is missing
        lo = max(offset, headers[0].base_offset)
        assert [r for r in decoded if r[0] >= offset] == self.rows(lo, headers[-1].next_offset)

    # Small chunks end reads on empty (compacted, filler) batches: see test_iter_records_with_small_chunks.
    @rule(pick=picks, pick_end=picks, chunk_bytes=st.sampled_from([1, 40, 100, 1 << 20]))
    def iter_records(self, pick: int, pick_end: int, chunk_bytes: int) -> None:
        start = self.pick_offset(pick)
        end = max(start, self.pick_offset(pick_end)) if pick_end % 3 else self.leo
        got = [row(r) for r in self.L.iter_records(start, end, chunk_bytes=chunk_bytes)]
        assert got == self.rows(start, end)

    @rule(pick=picks, shift=st.sampled_from([-1, 0, 0, 1]), extreme=st.sampled_from([None, None, None, 0, 2**62]))
    def offset_for_timestamp(self, pick: int, shift: int, extreme: int | None) -> None:
        if extreme is not None or not self.records:
            ts = 0 if extreme is None else extreme
        else:
            stamps = sorted({v[0] for v in self.records.values()})
            ts = max(stamps[pick % len(stamps)] + shift, 0)
        expected = next((o for o in sorted(self.records) if self.records[o][0] >= ts), None)
        assert self.L.offset_for_timestamp(ts) == expected

    # -- invariants ----------------------------------------------------------

    @invariant()
    def offsets_match(self) -> None:
        if self.log is None:
            return
        log = self.log
        assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (self.start, self.leo, self.hw)
        bases = [s.base_offset for s in log.segments]
        assert bases == sorted(set(bases)) and bases[0] == self.start

    @invariant()
    def records_match(self) -> None:
        if self.log is None:
            return
        assert [row(r) for r in self.log.iter_records(self.start)] == self.rows()

    @invariant()
    def out_of_range_reads_raise(self) -> None:
        if self.log is None:
            return
        log = self.log
        for bad in (self.start - 1, self.leo + 1):
            with pytest.raises(OffsetOutOfRange):
                log.read(bad)
            with pytest.raises(OffsetOutOfRange):
                log.read_raw(bad)
        assert log.read(self.leo) == []
        assert log.read_raw(self.leo) == b""

    @invariant()
    def timestamps_match(self) -> None:
        """offset_for_timestamp at each segment's newest timestamp (and just above): a segment whose
        max timestamp is underestimated would be skipped (and could be deleted early by age)."""
        if self.log is None or not self.records:
            return
        probes = {min(v[0] for v in self.records.values())}
        for seg in self.log.segments:
            stamps = [self.records[o][0] for o in self.records if seg.base_offset <= o < seg.next_offset]
            if stamps:
                probes |= {max(stamps), max(stamps) + 1}
        for t in sorted(probes):
            expected = next((o for o in sorted(self.records) if self.records[o][0] >= t), None)
            assert self.log.offset_for_timestamp(t) == expected, f"offset_for_timestamp({t})"

    @invariant()
    def epoch_cache_matches(self) -> None:
        if self.log is None:
            return
        entries = [(e.epoch, e.start_offset) for e in self.log.epoch_cache.entries]
        for (e1, o1), (e2, o2) in pairwise(entries):
            assert e1 < e2 and o1 < o2, f"epoch cache not monotonic: {entries}"
        assert all(self.start <= o <= self.leo for _e, o in entries)
        assert entries == self.epochs


CommitLogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestCommitLogModel = CommitLogMachine.TestCase


# -- codec properties ----------------------------------------------------------

int64s = st.integers(-(2**63), 2**63 - 1)
surrogates: tuple[Literal["Cs"]] = ("Cs",)
header_names = st.text(st.characters(blacklist_categories=surrogates), max_size=12)
any_records = st.lists(
    st.builds(
        NewRecord,
        value=st.binary(max_size=64),
        key=st.one_of(st.none(), st.binary(max_size=16)),
        headers=st.dictionaries(header_names, st.binary(max_size=16), max_size=4),
        timestamp=st.one_of(st.none(), int64s),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 2**62),
    epoch=st.integers(0, 2**31 - 1),
    records=any_records,
    default_ts=int64s,
    data=st.data(),
)
def test_codec_roundtrip(base: int, epoch: int, records: list[NewRecord], default_ts: int, data: st.DataObject) -> None:
    buf = encode_batch(base, epoch, records, default_ts)
    headers = list(iter_batch_headers(buf, verify=True))
    assert len(headers) == 1
    h = headers[0]
    stamps = [default_ts if r.timestamp is None else r.timestamp for r in records]
    assert (h.position, h.size, h.base_offset, h.leader_epoch) == (0, len(buf), base, epoch)
    assert (h.record_count, h.last_offset_delta, h.next_offset) == (len(records), len(records) - 1, base + len(records))
    assert (h.first_timestamp, h.max_timestamp) == (stamps[0], max(stamps))
    expected = [
        (base + i, ts, r.key, r.value, dict(r.headers)) for i, (r, ts) in enumerate(zip(records, stamps, strict=True))
    ]
    assert [row(r) for r in decode_records(buf, h)] == expected
    assert record_keys(buf, h) == [(base + i, r.key) for i, r in enumerate(records)]

    # bounds, and the same batch in the middle of a larger buffer
    lo = data.draw(st.integers(base, base + len(records)), label="min_offset")
    hi = data.draw(st.integers(lo, base + len(records)), label="max_offset")
    pad = encode_batch(0, 0, [NewRecord(b"pad")], 0)
    mv = memoryview(pad + buf + pad)
    middle = list(iter_batch_headers(mv, verify=True))
    assert [x.position for x in middle] == [0, len(pad), len(pad) + len(buf)]
    assert [row(r) for r in decode_records(mv, middle[1], lo, hi)] == [e for e in expected if lo <= e[0] < hi]

    # retain_records keeps exactly the chosen records, bytes and offsets unchanged
    keep = data.draw(st.sets(st.integers(0, len(records) - 1)), label="keep")
    kept = retain_records(buf, h, sorted(keep))
    if not keep:
        assert kept is None
    else:
        assert kept is not None
        (kh,) = iter_batch_headers(kept, verify=True)
        assert (kh.base_offset, kh.leader_epoch, kh.last_offset_delta) == (base, epoch, len(records) - 1)
        assert [row(r) for r in decode_records(kept, kh)] == [expected[i] for i in sorted(keep)]


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(any_records.map(lambda rs: rs[:4]), min_size=1, max_size=4), base=st.integers(0, 2**40))
def test_iter_batch_headers_on_every_prefix(batches: list[list[NewRecord]], base: int) -> None:
    """Every prefix of a clean buffer yields exactly the batches it holds whole, and never raises."""
    parts = []
    for records in batches:
        parts.append(encode_batch(base, 3, records, 7))
        base += len(records)
    buf = b"".join(parts)
    full = list(iter_batch_headers(buf, verify=True))
    assert len(full) == len(batches)
    ends = [h.position + h.size for h in full]
    assert ends[-1] == len(buf)
    for cut in range(len(buf) + 1):
        prefix = buf[:cut]
        got = list(iter_batch_headers(prefix, verify=True))
        assert got == [h for h, end in zip(full, ends, strict=True) if end <= cut], f"prefix of {cut} bytes"
        for h in got:
            decode_records(prefix, h)
    # the same through a memoryview and from a position inside the buffer
    assert list(iter_batch_headers(memoryview(buf)[: ends[0]])) == full[:1]
    assert list(iter_batch_headers(buf, ends[0])) == full[1:]


# -- focused regressions for bugs the properties found ------------------------------------


@pytest.fixture
def log_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="liftlog-model-", dir=_FAST_TMP)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_iter_records_with_small_chunks_crosses_empty_batches(log_dir: str) -> None:
    """iter_records took an empty read() for the end of the log, but read() returned [] when its byte
    budget ended on an empty (compacted or truncation filler) batch."""
    log = CommitLog.open(log_dir, LogConfig())
    try:
        log.append([NewRecord(b"x", key=b"k")] * 3)
        log.roll()
        log.append([NewRecord(b"y", key=b"k")] * 3)
        log.roll()
        log.append([NewRecord(b"z")])
        log.set_high_watermark(log.newest_offset)
        log.compact()  # segment 0 keeps only an empty batch covering offsets 0..2
        assert [r.offset for r in log.iter_records(0)] == [5, 6]
        assert [r.offset for r in log.iter_records(0, chunk_bytes=40)] == [5, 6]
        assert [r.offset for r in log.read(0, max_bytes=1)] == [5]
    finally:
        log.close()


def test_truncate_into_a_gap_wider_than_int32(log_dir: str) -> None:
    """Truncating into an offset gap fills it with empty batches, whose last_offset_delta is an int32:
    one filler for a gap wider than 2**31 offsets raised struct.error with the log half truncated."""
    log = CommitLog.open(log_dir, LogConfig())
    try:
        log.append([NewRecord(b"x")] * 10)
        base = 10 + 2**31 + 5  # a leader's batch after a gap of 2**31 + 5 offsets, same segment
        log.append_raw(encode_batch(base, 0, [NewRecord(b"y")] * 5, 1))
        log.truncate_to(2**31 + 12)
        assert log.log_end_offset == 2**31 + 12
        assert [r.offset for r in log.iter_records(0)] == list(range(10))
        log.close()
        log = CommitLog.open(log_dir, LogConfig())
        assert log.log_end_offset == 2**31 + 12
        assert log.append([NewRecord(b"z")]) == 2**31 + 13
    finally:
        log.close()


def test_truncate_into_a_gap_between_segments_wider_than_uint32(log_dir: str) -> None:
    config = LogConfig(index_interval_bytes=1)
    log = CommitLog.open(log_dir, config)
    try:
        log.append([NewRecord(b"x")] * 10)
        # past the relative offset range of segment 0: the raw batch starts a new segment
        log.append_raw(encode_batch(2**32 + 17, 0, [NewRecord(b"y")] * 5, 1))
        assert [s.base_offset for s in log.segments] == [0, 2**32 + 17]
        log.truncate_to(2**32 + 15)
        assert log.log_end_offset == 2**32 + 15
    finally:
        log.close()
    log = CommitLog.open(log_dir, config)
    try:
        assert log.log_end_offset == 2**32 + 15
        assert [r.offset for r in log.iter_records(0)] == list(range(10))
    finally:
        log.close()
