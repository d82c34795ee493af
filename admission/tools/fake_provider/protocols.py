"""The protocols (OpenAI's and Anthropic's): request bodies in, answers out."""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from .pools import MAX_TOKENS, Outcome
from .statuses import ERRORS

FILLER = ("The quick brown fox jumps over the lazy dog while the fake provider pretends to think "
          "about your question and answers it at the pace of the model.").split()


# -- the protocols: request bodies in, answers out --------------------------------------------


class BadRequest(Exception):
    """A request the protocol layer refuses before the model sees it (status, message)."""

    def __init__(self, status: int, message: str | None = None):
        super().__init__(message or ERRORS[status][3])
        self.status = status


@dataclass
class Ask:
    """A parsed chat request, either protocol."""

    model: str
    tokens: int
    capped: bool
    prompt_tokens: int
    stream: bool
    include_usage: bool = False


def _chars(x: Any) -> int:
    """Characters of the text in a message list (the strings, not the roles or types)."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, list):
        return sum(_chars(v) for v in x)
    if isinstance(x, dict):
        return sum(_chars(v) for k, v in x.items() if k not in ("role", "type"))
    return 0


def _max_tokens(body: dict, names: Sequence[str], default: int) -> tuple[int, bool]:
    for name in names:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadRequest(400, f"{name} must be a positive integer")
            return min(value, MAX_TOKENS), value > MAX_TOKENS
    return default, False


def parse_ask(raw: bytes, protocol: str, default_tokens: int) -> Ask:
    """The request body of a chat route, or BadRequest(400)."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest(400, "model: a model name is required")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest(400, "messages must be a list")
    names = ("max_completion_tokens", "max_tokens") if protocol == "openai" else ("max_tokens",)
    tokens, capped = _max_tokens(body, names, default_tokens)
    chars = _chars(messages) + (_chars(body.get("system")) if protocol == "anthropic" else 0)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Ask(name, tokens, capped, max(1, chars // 4), bool(body.get("stream")), include_usage)


def filler(tokens: int) -> str:
    """Some text for a round of ``tokens`` tokens (at most a few dozen words)."""
    return " ".join(FILLER[i % len(FILLER)] for i in range(max(1, min(tokens, 48))))


def _pieces(text: str, n: int = 4) -> list[str]:
    words = text.split(" ")
    step = max(1, math.ceil(len(words) / n))
    return [" ".join(words[i:i + step]) + (" " if i + step < len(words) else "") for i in range(0, len(words), step)]


def _sse(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        out.append(f"{head}data: {payload}\n\n")
    return "".join(out).encode()


def openai_answer(ask: Ask, out: Outcome) -> tuple[bytes, str]:
    """A chat.completion object, or its chunk stream."""
    cid, created, text = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), filler(out.tokens)
    finish = "length" if ask.capped else "stop"
    usage: dict[str, Any] = {"prompt_tokens": ask.prompt_tokens, "completion_tokens": out.tokens,
                             "total_tokens": ask.prompt_tokens + out.tokens}
    if out.prompt is not None:  # a cache share is set: what was read from the cache
        usage["prompt_tokens_details"] = {"cached_tokens": out.prompt.cache_read}
    if not ask.stream:
        body = {"id": cid, "object": "chat.completion", "created": created, "model": ask.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                             "logprobs": None, "finish_reason": finish}],
                "usage": usage, "system_fingerprint": "fake-provider"}
        return json.dumps(body).encode(), "application/json"

    def chunk(delta: dict, reason: str | None = None, choices: bool = True) -> dict:
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": ask.model,
             "system_fingerprint": "fake-provider",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}] if choices else []}
        if ask.include_usage:
            c["usage"] = None
        return c

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(text)]
    events.append(chunk({}, finish))
    if ask.include_usage:
        events.append({**chunk({}, choices=False), "usage": usage})
    return _sse([(None, e) for e in events] + [(None, "[DONE]")]), "text/event-stream"


def anthropic_answer(ask: Ask, out: Outcome) -> tuple[bytes, str]:
    """A message object, or its event stream."""
    mid, text = f"msg_{uuid.uuid4().hex[:24]}", filler(out.tokens)
    stop = "max_tokens" if ask.capped else "end_turn"
    usage: dict[str, Any] = {"input_tokens": ask.prompt_tokens, "output_tokens": out.tokens}
    if out.prompt is not None:  # a cache share is set: input_tokens is then the uncached part
        usage = {"input_tokens": out.prompt.uncached, "cache_creation_input_tokens": out.prompt.cache_creation,
                 "cache_read_input_tokens": out.prompt.cache_read, "output_tokens": out.tokens}
    message = {"id": mid, "type": "message", "role": "assistant", "model": ask.model,
               "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_sequence": None,
               "usage": usage}
    if not ask.stream:
        return json.dumps(message).encode(), "application/json"
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": piece}}) for piece in _pieces(text)]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": out.tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return _sse(events), "text/event-stream"


def error_body(protocol: str, status: int, message: str) -> bytes:
    anthropic_type, openai_type, code, _ = ERRORS.get(status, ERRORS[500])
    if protocol == "anthropic":
        body: dict = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        body = {"error": {"message": message, "type": openai_type, "param": None, "code": code}}
    return json.dumps(body).encode()
