"""The rate-limit headers a provider sends on every response, from its buckets' state (in the
words ``admission.ratelimits`` reads back).

* OpenAI style: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (RPM, else RPD; TPM,
  else TPD); the reset is a Go duration until the bucket is full (``6m0s``, ``1.5s``, ``20ms``).
* Anthropic style: ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,
  remaining,reset}`` (RPM, ITPM, OTPM; ``tokens``: TPM, else the most restrictive of ITPM and
  OTPM); the reset is an RFC 3339 time, token remainings are rounded down to the thousand.

The state's resets are provider seconds; the headers speak real time (``scale`` provider seconds
pass per real second), as a client waits in it.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Mapping

State = Mapping[str, Mapping[str, float]]  # kind -> {"limit", "remaining", "reset_s"}
ANTHROPIC_TOKEN_ROUNDING = 1000


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset: ``20ms`` below a second, else ``1h2m3.5s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    seconds = math.ceil(seconds * 1000) / 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    if hours:
        text = f"{int(hours)}h{text}"
    return text


def rfc3339(unix_s: float) -> str:
    """A time as Anthropic writes a reset (whole seconds, rounded up, UTC)."""
    return datetime.fromtimestamp(math.ceil(unix_s), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first(state: State, *kinds: str) -> Mapping[str, float] | None:
    return next((state[k] for k in kinds if k in state), None)


def openai_headers(state: State, scale: float) -> dict[str, str]:
    out = {}
    for what, kinds in (("requests", ("rpm", "rpd")), ("tokens", ("tpm", "tpd"))):
        if (s := _first(state, *kinds)) is not None:
            out[f"x-ratelimit-limit-{what}"] = f"{s['limit']:.0f}"
            out[f"x-ratelimit-remaining-{what}"] = str(math.floor(s["remaining"]))
            out[f"x-ratelimit-reset-{what}"] = go_duration(s["reset_s"] / scale)
    return out


def anthropic_headers(state: State, scale: float, wall_now: float) -> dict[str, str]:
    tokens = state.get("tpm")
    if tokens is None and (split := [state[k] for k in ("itpm", "otpm") if k in state]):
        tokens = min(split, key=lambda s: s["remaining"])
    out = {}
    for what, s, rounding in (("requests", state.get("rpm"), 1), ("input-tokens", state.get("itpm"), 0),
                              ("output-tokens", state.get("otpm"), 0), ("tokens", tokens, 0)):
        if s is None:
            continue
        step = rounding or ANTHROPIC_TOKEN_ROUNDING
        out[f"anthropic-ratelimit-{what}-limit"] = f"{s['limit']:.0f}"
        out[f"anthropic-ratelimit-{what}-remaining"] = str(math.floor(s["remaining"] / step) * step)
        out[f"anthropic-ratelimit-{what}-reset"] = rfc3339(wall_now + s["reset_s"] / scale)
    return out


def rate_headers(style: str, state: State, scale: float, wall_now: float) -> dict[str, str]:
    return openai_headers(state, scale) if style == "openai" else anthropic_headers(state, scale, wall_now)
