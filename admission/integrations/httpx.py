"""httpx transports that admit every request (``pip install httpx``).

    transport = AdmissionTransport(adm, lane="reviews", provider="openai")
    client = httpx.Client(transport=transport)                       # any HTTP API
    sdk = openai.OpenAI(http_client=httpx.Client(transport=transport))  # or an SDK's requests

``AdmissionTransport`` (an ``httpx.BaseTransport``, with ``Admission``) and
``AsyncAdmissionTransport`` (an ``httpx.AsyncBaseTransport``, with ``AsyncAdmission``) wrap an
inner transport (default: httpx's own) and run each request as one round.
``Httpx2AdmissionTransport`` / ``AsyncHttpx2AdmissionTransport`` are the same over ``httpx2``,
which the OpenAI 3.x and Anthropic 2.x SDKs run on (OpenAI also takes an ``httpx.Client``;
Anthropic only an ``httpx2`` one): ``anthropic.Anthropic(http_client=httpx2.Client(
transport=Httpx2AdmissionTransport(adm, ...)))``.

Choices:

* **The pool** is ``pool=`` (a name, or a callable given the request), else the JSON body's
  ``"model"`` + ``"@"`` + ``provider``; neither is a ``BadArgument`` before anything is sent.
  Lane, agent and round id: ``lane=``, else ``admission.integrations.use(...)``; round id from
  ``use(round_id=...)`` else a fresh uuid per request.
* **A response is not an exception at this level.** Its status is classified when its body is
  closed: 2xx/3xx is ``clean``, anything else ``admission.classify.signal_of`` of the status,
  headers and the body's text (a 403 daily key limit needs the text), with the Retry-After of a
  429/529 handed on (``r.outcome``, ``r.retry_after``). An exception of the inner transport (a
  timeout, a refused connection) ends the round with its own classification.
* **The round lasts until the response body is closed** (``close()`` / ``aclose()``: httpx does
  it after reading a whole body, and at the end of ``client.stream(...)``), so a streamed answer
  holds its seat while it streams. A response dropped unclosed ends its round when collected.
* **Cost** from the ``usage`` of a JSON body, or of the events of a server-sent-events body
  (OpenAI's usage chunk, Anthropic's ``message_start`` / ``message_delta``), at the pool's prices:
  the body is teed while it is read, up to ``TEE_LIMIT`` (1 MB; past it, no cost).
* **Join**: a request made inside a ``round()`` of the same admission runs inside it (no second
  seat), as the SDK wrappers' calls do; its cost is charged once per request id and a 429/529 is
  reported on the round. Before it is sent it takes what its JSON body declares from the rate
  ceilings (``Round.reserve_call``: the round's first call is its admit's reservation), and a
  2xx response's usage is added to the round's, whose end reconciles the sum of its calls.
  ``join=False`` makes it a delegated sub-round instead.
* **A refused round moves only to alternatives of the same provider** (``round(move_to=...)``),
  and the JSON body's ``model`` is rewritten to that pool's model; a seat elsewhere (the policy
  changed between ranking and admit) raises ``MovedAway`` (the request is not sent).
* **Sizes** (the cap line, design §4): with ``declare_budget=True`` a request declares its JSON
  body's answer budget (``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens``) as its
  round's size, and its round ends with the usage's output count. Off by default, as in the SDK
  wrappers. No progress is reported: the transport sees bytes, not an SDK's events.
* **Rate ceilings** (design §5.9, ``_counts``): a request with a JSON body (read before it is
  sent; any other body is not read) declares its answer budget and the estimate of its prompt
  (its text's characters / 4; an ``/embeddings`` request answers no tokens), and a 2xx response
  ends its round with the usage of its body (``r.usage``; the teed body, so none past
  ``TEE_LIMIT``). Any other status sends none: the reservation stays charged.
* **Rate-limit headers**: each response's (``x-ratelimit-*``, ``anthropic-ratelimit-*``) are
  read into its round (``r.rate_reading``) when its body is closed; a 429 whose headers or body
  name a spent ceiling ends the round ``ceiling`` (not load: the estimate is not cut), a joined
  request reports it on its round. A header that cannot be read never fails the request.
* The SDKs' own retries, through this transport, are each a new admitted round.
"""
from __future__ import annotations

import functools
import importlib.util
from typing import Any

from ._common import MovedAway, require, use
from ._http import TEE_LIMIT, StatusView, Verdict, usage_of_body  # noqa: F401 - as before the split
from ._httpx_async import AsyncRoundBody, AsyncRoundTransport
from ._httpx_sync import RoundBody, RoundTransport
from ._primitives import end_unclosed
from ..errors import BadArgument

if importlib.util.find_spec("httpx") is None and importlib.util.find_spec("httpx2") is None:
    raise ImportError("admission.integrations.httpx needs 'httpx' (or 'httpx2'): pip install httpx")

__all__ = ["AdmissionTransport", "AsyncAdmissionTransport", "Httpx2AdmissionTransport",
           "AsyncHttpx2AdmissionTransport", "transports", "TEE_LIMIT", "use", "MovedAway"]


# -- the concrete classes, over httpx or httpx2 ------------------------------------------------------
@functools.cache
def transports(module: str = "httpx") -> tuple[type, type]:
    """(AdmissionTransport, AsyncAdmissionTransport) built over ``httpx`` or ``httpx2`` (the
    same API; the OpenAI 3.x and Anthropic 2.x SDKs run on httpx2 and Anthropic refuses httpx
    objects). Each class is a ``BaseTransport`` / ``AsyncBaseTransport`` of that module."""
    if module not in _FLAVORS:
        raise BadArgument(f"transports() is built over one of {', '.join(_FLAVORS)}, got {module!r}")
    hx = require(module, module)
    # only the sync body has a finalizer: under asyncio, asyncio's own finalizer of the
    # abandoned round() ends the round of a response dropped unclosed
    body = type("_RoundBody", (RoundBody, hx.SyncByteStream), {"__del__": _end_unclosed})
    abody = type("_AsyncRoundBody", (AsyncRoundBody, hx.AsyncByteStream), {})
    prefix = _FLAVORS[module]
    sync = type(f"{prefix}AdmissionTransport", (RoundTransport, hx.BaseTransport),
                {"_hx": hx, "_Body": body, "__doc__": RoundTransport.__doc__, "__module__": __name__})
    asyn = type(f"Async{prefix}AdmissionTransport", (AsyncRoundTransport, hx.AsyncBaseTransport),
                {"_hx": hx, "_Body": abody, "__doc__": AsyncRoundTransport.__doc__, "__module__": __name__})
    return sync, asyn


def _end_unclosed(body: RoundBody) -> None:
    end_unclosed(body, "response", "close the response (or read it); its round ends now")


_FLAVORS = {"httpx": "", "httpx2": "Httpx2"}
_NAMES = {"AdmissionTransport": ("httpx", 0), "AsyncAdmissionTransport": ("httpx", 1),
          "Httpx2AdmissionTransport": ("httpx2", 0), "AsyncHttpx2AdmissionTransport": ("httpx2", 1)}


if importlib.util.find_spec("httpx") is not None:
    AdmissionTransport, AsyncAdmissionTransport = transports("httpx")
if importlib.util.find_spec("httpx2") is not None:
    Httpx2AdmissionTransport, AsyncHttpx2AdmissionTransport = transports("httpx2")


def __getattr__(name: str) -> Any:
    """A transport over a module that is not installed: its one-line ImportError."""
    if name in _NAMES:
        module, i = _NAMES[name]
        return transports(module)[i]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
