"""The model test of the commit log with disk faults as extra rules.

``FaultyLogMachine`` is ``CommitLogMachine`` with its log on a
``FaultyFileIO``, fsync ``always``, and sealed segments reading through a
descriptor budget of two (so descriptors are closed and reopened all the
time, compaction included). Its fault rule arms one fault (an
operation, an error, how many matching calls pass first, whether a write
stops halfway, whether the fault stays until cleared), runs one of the
machine's write rules under it, and checks the outcome against the model:
a write that raises changed nothing, a truncation that raises left a log
that ends somewhere between the goal and where it ended before, and once
the cause is gone the log repairs itself and takes writes again. Every
invariant of the model test holds after every step.
"""

from __future__ import annotations

import errno
from dataclasses import replace

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, note, settings
from hypothesis.stateful import rule

from liftlog.storage import CommitLog, FsyncPolicy, LogFenced, WriteFailed
from liftlog.storage.descriptors import DescriptorBudget
from liftlog.storage.faults import FaultyFileIO

from .test_log_model import CommitLogMachine, epoch_bumps, picks, record_lists

# Weighted towards the calls every write makes, so most armed faults fire.
_FAULT_OPS = ["write", "write", "write", "fsync", "fsync", "ftruncate", "open", "replace", "unlink", "size"]
_ERRORS = [errno.EIO, errno.ENOSPC, errno.EMFILE]
_ACTIONS = ["append", "append_raw", "truncate_to", "roll", "retention"]


class FaultyLogMachine(CommitLogMachine):
    def __init__(self) -> None:
        super().__init__()
        self.io = FaultyFileIO()
        self.budget = DescriptorBudget(2)

    def open(self) -> None:
        assert self.dir is not None
        self.config = replace(self.config, fsync=FsyncPolicy.ALWAYS)  # so that fsync faults have work
        self.log = CommitLog.open(self.dir, self.config, clock=self.clock, io=self.io, budget=self.budget)

    def _snapshot(self) -> tuple[object, ...]:
        return (dict(self.records), self.start, self.leo, self.hw, list(self.epochs))

    def _restore(self, snap: tuple[object, ...]) -> None:
        records, start, leo, hw, epochs = snap
        self.records, self.start, self.leo, self.hw, self.epochs = records, start, leo, hw, epochs  # type: ignore[assignment]

    @rule(
        operation=st.sampled_from(_FAULT_OPS),
        error=st.sampled_from(_ERRORS),
        after=st.sampled_from([0, 0, 0, 1, 2]),
        partial=st.booleans(),
        stuck=st.booleans(),
        cut_fails=st.booleans(),
        action=st.sampled_from(_ACTIONS),
        spec=record_lists,
        bump=epoch_bumps,
        pick=picks,
    )
    def fault_during_a_write(
        self,
        operation: str,
        error: int,
        after: int,
        partial: bool,
        stuck: bool,
        cut_fails: bool,
        action: str,
        spec: tuple[int, int],
        bump: int,
        pick: int,
    ) -> None:
        snap = self._snapshot()
        old_leo = self.leo
        self.io.fail(operation, error, after=after, partial=partial, times=-1 if stuck else 1)
        if cut_fails:  # undoing by cutting the file back fails too: the log must fence, not lie
            self.io.fail("ftruncate", errno.EIO, times=-1)
        note(
            f"fault: {operation} {errno.errorcode[error]} after {after} partial={partial} stuck={stuck} "
            f"cut_fails={cut_fails} on {action}"
        )
        goal = None
        try:
            if action == "append":
                self.append(spec, bump)
            elif action == "append_raw":
                # Sometimes after a gap (a roll, or renaming an empty active segment, before the write). Not
                # into an empty log: renamed for its first offset, its log start moves even if the write fails.
                gap = pick % 3 if self.leo > self.start else 0
                self.append_raw([(gap, spec)], bump)
            elif action == "truncate_to":
                goal = self.pick_offset(pick)
                self.truncate_to(pick)
            elif action == "roll":
                self.L.roll()
            else:
                self.enforce_retention("messages", pick)
            outcome = "completed"
        except WriteFailed:
            outcome = "failed"
        except LogFenced:
            outcome = "fenced"
        finally:
            self.io.clear()
        event(f"fault on {action}: {outcome}")
        if outcome == "completed":
            return
        log = self.L
        if action == "truncate_to":
            # Cut short: the log ends at or before its old end, whole, and the model follows. It may end
            # below the goal: a straddling batch whose kept part could not be written back is gone whole.
            leo = log.log_end_offset
            self._restore(snap)
            assert goal is not None and leo <= old_leo, (goal, leo, old_leo)
            self._model_truncate(leo)
        else:
            self._restore(snap)
        assert log.repair(), f"the log stayed fenced after the fault was cleared: {log.fenced}"
        if action == "truncate_to" and log.log_end_offset != self.leo:
            # The repair finished a truncation a failed delete had interrupted.
            self._model_truncate(log.log_end_offset)
        assert log.fenced is None

    def _model_truncate(self, offset: int) -> None:
        for o in [o for o in self.records if o >= offset]:
            del self.records[o]
        self.leo = min(self.leo, offset)
        self.epochs = [e for e in self.epochs if e[1] < offset]
        self.clamp_hw()


FaultyLogMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestFaultyLogModel = FaultyLogMachine.TestCase
