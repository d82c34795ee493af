"""SDK calls: an SDK client's admitted methods, run through the admission.

* **SDK calls** (``Calls``, ``AsyncCalls``, ``SDKProxy``): the admitted methods of an SDK client
  run through the admission; everything else passes through untouched. ``AsyncCalls`` is
  written once (``_calls_async.py``) and ``Calls`` generated from it (``_calls_sync.py``).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable

from ._calls import check_pair, received_of
from ._calls_async import AsyncCalls
from ._calls_sync import Calls
from ._common import Settings
from ..aio import AsyncAdmission
from ..client import Admission
from ..errors import BadArgument

__all__ = ["Calls", "AsyncCalls", "SDKProxy", "wrap_client", "check_pair", "received_of"]


#: The admitted methods that answer no tokens (their answer budget is 0 for the ceilings).
NO_ANSWER = frozenset({("embeddings", "create")})


def _bind(calls: Calls | AsyncCalls, kind: str, method: Callable[..., Any],
          raw: Callable[..., Any] | None = None, answers: bool = True) -> Callable[..., Any]:
    """An SDK method, admitted: ``call`` (create / parse; ``raw``: its ``with_raw_response`` form,
    which gives the answer's headers too; ``answers``: False when it answers no tokens) or
    ``manager`` (a ``.stream()`` helper)."""
    if kind == "manager":
        @functools.wraps(method)
        def stream(*args: Any, **kwargs: Any) -> Any:
            return calls.manager(method, args, kwargs)
        return stream
    return calls.bind(method, raw, answers)


def _raw_form(resource: Any, name: str) -> Callable[..., Any] | None:
    """``resource.with_raw_response.<name>`` (the answer's HTTP response, its ``.parse()`` the
    answer), or None where the SDK has none (Anthropic's ``messages.parse``)."""
    try:
        return getattr(resource.with_raw_response, name, None)
    except Exception:  # noqa: BLE001 - no raw form: the answer comes without its headers
        return None
class SDKProxy:
    """An SDK client (or one of its resources) whose admitted methods (``table``: attribute path
    -> ``call`` | ``manager``) run through the admission on a copy of the client that never
    retries by itself (``quiet``); every other attribute is the client's own."""

    def __init__(self, target: Any, quiet: Any, calls: Calls | AsyncCalls, table: Mapping[tuple[str, ...], str],
                 path: tuple[str, ...] = (), rewrap: Callable[[Any], Any] | None = None):
        self._target, self._quiet, self._calls = target, quiet, calls
        self._table, self._path, self._rewrap = table, path, rewrap

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_target", "_quiet", "_calls", "_table", "_path", "_rewrap"):
            raise AttributeError(name)
        value = getattr(self._target, name)
        path = (*self._path, name)
        kind = self._table.get(path)
        if kind is not None:
            return _bind(self._calls, kind, getattr(self._quiet, name),
                         _raw_form(self._quiet, name) if kind == "call" else None, path not in NO_ANSWER)
        if any(p[:len(path)] == path for p in self._table):
            return SDKProxy(value, getattr(self._quiet, name), self._calls, self._table, path)
        if not self._path and name in ("with_options", "copy") and self._rewrap is not None:
            return lambda *a, **kw: self._rewrap(value(*a, **kw))  # the copy is admitted too
        return value

    def __dir__(self) -> list[str]:
        return dir(self._target)

    def __repr__(self) -> str:
        return f"<admitted {self._target!r}>"

    @property
    def unwrapped(self) -> Any:
        """The SDK object this proxy admits calls of."""
        return self._target


def wrap_client(client: Any, adm: Any, *, sdk: str, types: tuple[type, type], table: Mapping[tuple[str, ...], str],
                settings: Settings, again: Callable[[Any], Any]) -> SDKProxy:
    """The proxy an SDK module's ``wrap()`` returns: ``types`` = (sync client, asyncio client);
    ``again`` wraps a copy of the client (``with_options``) with the same settings."""
    if isinstance(client, SDKProxy):
        client = client.unwrapped
    sync_type, async_type = types
    if isinstance(client, async_type):
        is_async = True
    elif isinstance(client, sync_type):
        is_async = False
    else:
        raise BadArgument(f"wrap() needs a {sdk}.{sync_type.__name__} or {sdk}.{async_type.__name__} client, "
                          f"got {type(client).__name__}")
    check_pair(adm, AsyncAdmission if is_async else Admission, f"a {type(client).__name__} client")
    calls = (AsyncCalls if is_async else Calls)(adm, settings)
    return SDKProxy(client, client.with_options(max_retries=0), calls, table, rewrap=again)
