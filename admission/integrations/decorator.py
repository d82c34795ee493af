"""``@admitted(...)``: a plain function whose every call is one round.

    @admitted(lambda: ADM, lane="triage", model="sonnet@anthropic",
              round_id=lambda issue, **_: f"triage/{issue}")
    def triage(issue: str, *, round=None):
        ...                      # round: the handle (r.pool, r.cost_usd = ..., r.report(...))

Choices:

* **Sync and async** by the function itself (``inspect.iscoroutinefunction``): a coroutine
  function waits with an ``AsyncAdmission`` (``async with adm.round(...)``), a plain one with an
  ``Admission``; the other pairing is a ``BadArgument`` at call time.
* **Lazy admission**: ``adm_or_getter`` is the client or a callable returning it, called at each
  call, so module-level functions can be decorated before the pod's client exists.
* **The handle** is passed as the keyword ``round`` only when the function's signature names a
  parameter ``round`` (a ``**kwargs`` catch-all does not count: the parameter is the opt-in).
* **Round id**: ``round_id`` (a string, or a callable given the call's arguments), else
  ``admission.integrations.use(round_id=...)``, else a fresh uuid per call. Lane: ``lane``, else
  ``use(lane=...)`` (``lane=None``). A call made inside another round is its delegated sub-round
  (the client's nesting rule; this decorator adds nothing to it).
* An exception leaving the function ends the round with its classification (``round()``'s rule).
* **Rate ceilings**: the decorator sees no request, so its rounds declare nothing (the scope's
  learned mean per call is reserved); a function that takes ``round`` may set ``round.usage``
  (``admission.Usage``) from its answer for the ceilings to reconcile. An SDK call wrapped by
  this package inside it joins its round and declares nothing either.
* **Moves only where the function can call**: the round stays on ``model`` unless ``move_to``
  (a predicate over pool names, ``round()``'s) says where else the function can run it; such a
  function reads where it runs from its ``round`` handle (``round.pool``).
"""
from __future__ import annotations

import functools
import inspect
import uuid
from typing import Any, Callable, TypeVar

from ._common import context
from ._calls import check_pair
from ..aio import AsyncAdmission
from ..client import Admission
from ..errors import BadArgument

__all__ = ["admitted"]

F = TypeVar("F", bound=Callable[..., Any])


def admitted(adm_or_getter: Any, *, lane: str | None, model: str,
             round_id: str | Callable[..., str] | None = None, timeout: float = 600.0,
             move_to: Callable[[str], bool] | None = None) -> Callable[[F], F]:
    """Run each call of the decorated function as one ``round()`` of ``adm_or_getter`` (an
    ``Admission`` / ``AsyncAdmission``, or a callable returning one) on pool ``model``."""
    if not isinstance(model, str) or "@" not in model:
        raise BadArgument(f"admitted(): model must be a pool name model@provider, got {model!r}")
    if round_id is not None and not isinstance(round_id, str) and not callable(round_id):
        raise BadArgument(f"admitted(): round_id must be a string, a callable or None, got {round_id!r}")

    def admission(is_async: bool) -> Any:
        adm = adm_or_getter if hasattr(adm_or_getter, "round") else adm_or_getter()
        check_pair(adm, AsyncAdmission if is_async else Admission,
                   "an async function" if is_async else "a plain function")
        return adm

    def ask(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        ctx = context()
        rid = round_id(*args, **kwargs) if callable(round_id) else round_id
        the_lane = lane or ctx.get("lane")
        agent = ctx.get("agent")
        if not the_lane and not agent:
            raise BadArgument("admitted(): no lane: pass lane= or call inside use(lane=...)")
        return dict(lane=the_lane, agent=agent, model=model, round_id=rid or ctx.get("round_id") or uuid.uuid4().hex,
                    timeout=timeout, move_to=move_to)

    def decorate(fn: F) -> F:
        wants_round = "round" in inspect.signature(fn).parameters
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                async with admission(True).round(**ask(args, kwargs)) as r:
                    if wants_round:
                        kwargs["round"] = r
                    return await fn(*args, **kwargs)
            return acall  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with admission(False).round(**ask(args, kwargs)) as r:
                if wants_round:
                    kwargs["round"] = r
                return fn(*args, **kwargs)
        return call  # type: ignore[return-value]

    return decorate
