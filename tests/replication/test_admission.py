"""The admission rules every publish path goes through (``replication.admission``)."""

from __future__ import annotations

import pytest

from liftlog.api import api_pb2
from liftlog.replication.admission import AckPolicy, AdmissionRules, Intake, Refusal, admit, intake

LEADER, ALL, NONE = AckPolicy.LEADER, AckPolicy.ALL, AckPolicy.NONE


def test_ack_policy_values_are_the_liftbridge_apis() -> None:
    assert (int(LEADER), int(ALL), int(NONE)) == (int(api_pb2.LEADER), int(api_pb2.ALL), int(api_pb2.NONE))


def test_a_plain_publish_is_taken() -> None:
    assert admit(AdmissionRules(), LEADER, 1, 100, -1, 7) is None
    assert admit(AdmissionRules(), NONE, 1, 100, -1, None) is None


@pytest.mark.parametrize("in_sync, refused", [(1, True), (2, False), (3, False)])
def test_ack_all_needs_min_isr_in_sync_replicas(in_sync: int, refused: bool) -> None:
    rules = AdmissionRules(min_isr=2)
    expected = Refusal.TOO_FEW_IN_SYNC if refused else None
    assert admit(rules, ALL, in_sync, 10, -1, 0) is expected  # at the leader
    assert admit(rules, ALL, in_sync, 10, -1, None) is expected  # at the front door


@pytest.mark.parametrize("policy", [LEADER, NONE])
def test_other_ack_policies_ignore_min_isr(policy: AckPolicy) -> None:
    assert admit(AdmissionRules(min_isr=3), policy, 1, 10, -1, 0) is None


def test_a_payload_over_the_limit_is_too_large() -> None:
    rules = AdmissionRules(max_payload=100)
    assert admit(rules, LEADER, 1, 100, -1, 0) is None
    assert admit(rules, LEADER, 1, 101, -1, 0) is Refusal.TOO_LARGE


def test_the_leader_refuses_an_expected_offset_other_than_its_log_end() -> None:
    rules = AdmissionRules(occ=True)
    assert admit(rules, LEADER, 1, 1, 5, 5) is None
    assert admit(rules, LEADER, 1, 1, 4, 5) is Refusal.WRONG_OFFSET
    assert admit(rules, LEADER, 1, 1, -1, 5) is None  # no expectation
    assert admit(AdmissionRules(), LEADER, 1, 1, 4, 5) is None  # concurrency control off


def test_with_concurrency_control_an_rpc_publish_must_ask_for_an_ack() -> None:
    rules = AdmissionRules(occ=True)
    assert admit(rules, NONE, 1, 1, -1, None) is Refusal.UNACKED_OCC
    assert admit(rules, NONE, 1, 1, -1, 3) is None  # a plain NATS publish reaching the leader carries none
    assert admit(AdmissionRules(), NONE, 1, 1, -1, None) is None


def test_refusals_come_in_order_offset_size_replicas() -> None:
    rules = AdmissionRules(min_isr=2, max_payload=10, occ=True)
    assert admit(rules, ALL, 1, 11, 4, 5) is Refusal.WRONG_OFFSET
    assert admit(rules, ALL, 1, 11, 5, 5) is Refusal.TOO_LARGE
    assert admit(rules, ALL, 1, 10, 5, 5) is Refusal.TOO_FEW_IN_SYNC


def test_intake_parks_while_the_lease_is_out_and_refuses_once_deposed() -> None:
    assert intake(leading=True, deposed=False, lease_valid=True) is Intake.WRITE
    assert intake(leading=True, deposed=False, lease_valid=False) is Intake.PARK
    assert intake(leading=False, deposed=True, lease_valid=True) is Intake.REFUSE
    assert intake(leading=False, deposed=False, lease_valid=True) is Intake.WRITE  # no role yet
