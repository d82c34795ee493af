"""The clients of a run: one that loses replies, and what the invariant compares across a call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis


# -- the clients -----------------------------------------------------------------------------------


class LossyRedis:
    """A client that loses the reply of the next FCALL of an armed command: the server applies the
    call, then the caller sees a ConnectionError (a reply lost on the way back). The reply that was
    lost is kept in ``lost_reply``."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.armed: set[str] = set()  # commands (admit, retry, ...) whose next reply is lost
        self.lost_reply: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = self._inner.execute_command(*args, **options)
        if args and args[0] == "FCALL":
            command = str(args[1]).split("_")[1] if str(args[1]).startswith("adm_") else ""
            if command in self.armed:
                self.armed.discard(command)
                self.lost_reply = reply
                raise redis.ConnectionError(f"reply to {command} lost (injected): the server applied it")
        return reply


@dataclass
class State:
    """What the invariant compares across one call: the primary's keys and both retry budgets."""
    primary: dict[str, Any]
    left: dict[str, Any]  # census retriesLeft per plane, at the call's caller time
