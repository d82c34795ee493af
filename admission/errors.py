"""Exceptions: one type per kind of bad input, each mapped from a Lua error prefix."""
from __future__ import annotations

import re

from .codes import ERRORS


class AdmissionError(Exception):
    """Base of every error this package raises."""


class BadArgument(AdmissionError, ValueError):
    """A malformed argument: missing, wrong type, NaN, negative, out of range."""


class BadName(BadArgument):
    """A name with braces, spaces, control characters, '|' or over 200 characters."""


class UnknownLane(AdmissionError, KeyError):
    """The lane is not in the policy."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownPool(UnknownLane):
    """The pool is not in the policy's catalog."""


class UnknownProvider(UnknownLane):
    """The provider is not declared in the policy."""


class UnknownSeat(AdmissionError):
    """No such seat: never admitted, or gone for more than a day."""


class NotYourSeat(AdmissionError):
    """The seat belongs to another pod, or to another admission of the same round id."""


class NoPolicy(AdmissionError):
    """No policy has been applied to this mesh yet."""


class PolicyError(AdmissionError, ValueError):
    """The policy file is malformed or breaks a rule; nothing was applied."""


class StaleVersion(PolicyError):
    """Applying a policy lost a compare-and-set on the version."""


class WaitTimeout(AdmissionError, TimeoutError):
    """A round waited longer than its timeout; its waiter ticket was removed. ``reason``: the
    last refusal's reason word (``admission-unavailable`` when Redis could not be reached)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class RoundInProgress(AdmissionError):
    """This pod already runs (or waits with) a round of this id: one live holder per round id."""


class ScriptError(AdmissionError):
    """Redis answered a script call with an error that is not one of the admission's own (for
    example a server out of memory, or a script killed): nothing was applied by this client."""


class Unavailable(AdmissionError, ConnectionError):
    """Redis could not be reached (only raised where no shed decision can stand in)."""


_BY_PREFIX = {
    ERRORS["BAD_ARG"]: BadArgument,
    ERRORS["BAD_NAME"]: BadName,
    ERRORS["UNKNOWN_LANE"]: UnknownLane,
    ERRORS["UNKNOWN_POOL"]: UnknownPool,
    ERRORS["UNKNOWN_SEAT"]: UnknownSeat,
    ERRORS["UNKNOWN_PROVIDER"]: UnknownProvider,
    ERRORS["NOT_YOUR_SEAT"]: NotYourSeat,
    ERRORS["NO_CONFIG"]: NoPolicy,
    ERRORS["BAD_POLICY"]: PolicyError,
    ERRORS["STALE_VERSION"]: StaleVersion,
}


#: What Redis and Valkey append to the error reply of a function or script: where in the Lua it
#: was raised (``script: adm_census_…, on @user_function:138.``). A message never carries it.
_LUA_LOCATION = re.compile(r"\s*script: [^\s,]+, on @\w+:\d+\.?\s*$")


def without_location(message: str) -> str:
    """An error reply's message without the Lua location the server appends to it."""
    return _LUA_LOCATION.sub("", message)


def from_reply(message: str) -> AdmissionError | None:
    """The exception for a script's error reply, or None when it is not one of ours."""
    prefix, _, rest = without_location(message).partition(" ")
    kind = _BY_PREFIX.get(prefix)
    return kind(rest or prefix) if kind else None
