"""Tests marked `own_process` (those that start Ray) run in a child pytest (tests/conftest.py)."""

import os

import pytest

pytestmark = pytest.mark.own_process


def test_a_test_marked_own_process_runs_in_a_child_pytest():
    assert os.environ.get("DUPLEXCADENCE_TEST_CHILD") == "1"
