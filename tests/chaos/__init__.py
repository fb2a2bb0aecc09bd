"""Fault injection for tests: a controllable TCP proxy (network faults) and process faults and schedules."""
