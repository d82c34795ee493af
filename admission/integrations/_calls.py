"""What an SDK client's sync and asyncio runners share (``Calls`` in ``_calls_sync.py``,
generated from ``AsyncCalls`` in ``_calls_async.py``): resolving, the model to call, retry
decisions, the round's declarations and end, and the checks both make.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import Ask, MovedAway, Settings, is_load, log
from ._counts import usage_of
from ._prices import answer_received
from ..aio import AsyncAdmission
from ..classify import retry_after_of
from ..errors import BadArgument


def check_pair(adm: Any, want: type, what: str) -> None:
    """A sync client needs a sync ``Admission``, an asyncio one an ``AsyncAdmission`` (``want``)."""
    if not isinstance(adm, want):
        raise BadArgument(f"{what} needs an admission.{want.__name__}, got {type(adm).__name__}"
                          + (" (an asyncio client waits with AsyncAdmission)" if want is AsyncAdmission
                             else " (a sync client waits with Admission)"))


def received_of(ask: Ask, usage: Any) -> float | None:
    """A declared round's answer tokens received in all, from its usage (None: not declared, or
    the usage says nothing)."""
    return answer_received(usage) if ask.tokens is not None else None


def end_with(handle: Any, ask: Ask, usage: Any) -> None:
    """A round's call ended well: the answer tokens it received (declared rounds) and what the
    provider counted (``handle.usage``, which the ceilings reconcile), from its usage."""
    handle.received = received_of(ask, usage)
    counted = usage_of(usage)
    if counted is not None:
        handle.usage = counted


class CallsBase:
    """What the sync and async runners share: resolving, the model to call, retry decisions."""

    def __init__(self, adm: Any, settings: Settings):
        self.adm, self.settings = adm, settings

    def round_for(self, ask: Ask) -> Any:
        # moves only to the pools this client can call (its provider's, or those ``pools`` names)
        return self.adm.round(lane=ask.lane, model=ask.pool, round_id=ask.round_id, timeout=self.settings.timeout,
                              agent=ask.agent, move_to=lambda pool: self.settings.model_for(pool, ask) is not None,
                              tokens=ask.tokens, input_tokens=ask.input_tokens, max_tokens=ask.max_tokens)

    @staticmethod
    def reporter(ask: Ask, handle: Any) -> Any:
        """What a stream of this round calls with its progress (None: the round declared no size)."""
        return handle.progress if ask.tokens is not None else None

    def _kwargs(self, kwargs: dict[str, Any], ask: Ask, handle: Any) -> dict[str, Any]:
        """The SDK's arguments for the pool the round was seated on (it may have moved)."""
        if handle.pool == ask.pool:
            return kwargs
        model = self.settings.model_for(handle.pool, ask)
        if model is None:
            raise MovedAway(f"round {ask.round_id} was seated on {handle.pool}, which this client cannot call "
                            f"(asked for {ask.pool})")
        log.info("call_moved", round=ask.round_id, asked=ask.pool, pool=handle.pool, model=model)
        return {**kwargs, "model": model}

    def _retry(self, exc: BaseException, attempt: int, ask: Ask) -> bool:
        if attempt >= self.settings.retries or not is_load(exc):
            return False
        log.info("provider_refused_retry", round=ask.round_id, pool=ask.pool, attempt=attempt + 1,
                 status=getattr(exc, "status_code", None), retry_after=retry_after_of(exc))
        return True

    def _call_pool(self, given: Mapping[str, Any], model: Any) -> str | None:
        try:
            return given.get("pool") or self.settings.pool_of(model)
        except BadArgument:
            return None
