"""A validator replica that starts while the API server does not answer waits for it (its
webhook is not served yet, so it is not ready) instead of exiting with a traceback; what
the API server refuses is raised as before."""

from __future__ import annotations

import pytest

from services.validator import webhook
from shared.kube import ApiError


async def test_a_call_is_repeated_while_the_api_server_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def no_wait(delay: float) -> None:
        waits.append(delay)

    monkeypatch.setattr("services.validator.webhook.asyncio.sleep", no_wait)
    answers: list[ApiError | str] = [
        ApiError(0, "NoAnswer", "connection refused"),
        ApiError(503, "ServiceUnavailable", "starting"),
        ApiError(0, "NoAnswer", "connection reset"),
        "registered",
    ]

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer

    assert await webhook._answered(call) == "registered"
    assert waits == [0.5, 1.0, 2.0], "backs off, doubling"


async def test_a_refusal_is_raised_at_once() -> None:
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        raise ApiError(403, "Forbidden", "cannot get secrets")

    with pytest.raises(ApiError, match="Forbidden"):
        await webhook._answered(call)
    assert calls == 1
