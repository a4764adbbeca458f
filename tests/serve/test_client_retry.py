"""`SessionClient.connect`'s retry policy (`retry_pause`): only a worker of several is retried: a full one
after a pause of 10 ms doubling up to 200 ms, one that leaves the session to another worker after 1 ms, each
until its retries are spent."""

from __future__ import annotations

import asyncio

import pytest

from duplexcadence.interpreter.serve import client, messages
from duplexcadence.interpreter.serve.client import Refused, retry_pause


def refusal(code: str, workers: int | None = 2, close_code: int = messages.CLOSE_TRY_AGAIN_LATER) -> Refused:
    return Refused(code, "", close_code, workers)


def test_a_full_worker_of_several_is_retried_after_a_growing_pause():
    full = refusal(messages.AT_CAPACITY)
    assert [retry_pause(full, attempt, None) for attempt in range(7)] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2]
    assert retry_pause(full, 15, None) == 0.2
    assert retry_pause(full, 16, None) is None  # 8 times the 2 workers
    assert retry_pause(full, 2, 3) == 0.04 and retry_pause(full, 3, 3) is None


def test_a_session_left_to_another_worker_is_retried_at_once_many_times():
    elsewhere = refusal(messages.OTHER_WORKER, workers=4)
    assert [retry_pause(elsewhere, attempt, None) for attempt in (0, 1, 255)] == [0.001] * 3
    assert retry_pause(elsewhere, 256, None) is None  # 64 times the 4 workers
    assert retry_pause(elsewhere, 5, 5) == 0.001  # retries= counts full workers' refusals only
    assert retry_pause(refusal(messages.OTHER_WORKER, close_code=messages.CLOSE_POLICY), 0, None) is None


@pytest.mark.parametrize(
    "refused",
    [
        refusal(messages.DRAINING),
        refusal(messages.SHUTTING_DOWN),
        refusal(messages.AT_CAPACITY, workers=None),
        refusal(messages.AT_CAPACITY, workers=1),
        refusal(messages.AT_CAPACITY, close_code=messages.CLOSE_POLICY),
    ],
)
def test_a_draining_or_stopping_worker_or_a_single_server_is_not_retried(refused):
    assert retry_pause(refused, 0, None) is None


def test_connect_counts_each_refusal_code_on_its_own(monkeypatch):
    """Five reconnects to reach the worker that places the session do not spend the full workers' retries."""
    answers = [messages.OTHER_WORKER] * 5 + [messages.AT_CAPACITY, messages.OTHER_WORKER, messages.AT_CAPACITY]
    calls, pauses = [], []

    async def connect_once(url, seed=0, open_timeout=600.0):
        calls.append(seed)
        raise refusal(answers[len(calls) - 1], workers=4)

    async def sleep(seconds):
        pauses.append(seconds)

    monkeypatch.setattr(client.SessionClient, "connect_once", staticmethod(connect_once))
    monkeypatch.setattr(client.asyncio, "sleep", sleep)
    with pytest.raises(Refused) as refused:
        asyncio.run(client.SessionClient.connect("ws://127.0.0.1:1/v1/session", seed=3, retries=1))
    assert refused.value.code == messages.AT_CAPACITY and len(calls) == 8
    assert pauses == [0.001] * 5 + [0.01, 0.001]
