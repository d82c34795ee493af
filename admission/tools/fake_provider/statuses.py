"""The statuses the fake provider answers, and their errors in either protocol's words."""
from __future__ import annotations

from ..sim import model

FAULT_STATUSES = (402, 500, 502, 503, 529)
STATUS_KEYS = ("200", "429", "529", "403", "402", "5xx", "504")


#: status -> (Anthropic error type, OpenAI error type, OpenAI code, default message)
ERRORS: dict[int, tuple[str, str, str | None, str]] = {
    400: ("invalid_request_error", "invalid_request_error", None, "Bad request"),
    401: ("authentication_error", "invalid_request_error", "invalid_api_key",
          "No API key: send 'Authorization: Bearer <key>' or 'x-api-key'"),
    402: ("billing_error", "insufficient_quota", "insufficient_credits", "Insufficient credits"),
    403: ("permission_error", "permission_error", "key_limit_exceeded", model.KEY_LIMIT_MESSAGE),
    404: ("not_found_error", "invalid_request_error", "not_found", "Not found"),
    405: ("invalid_request_error", "invalid_request_error", None, "Method not allowed"),
    411: ("invalid_request_error", "invalid_request_error", None,
          "Length required: send a Content-Length (chunked bodies are not supported)"),
    413: ("request_too_large", "invalid_request_error", None, "Request body too large"),
    429: ("rate_limit_error", "rate_limit_error", "rate_limit_exceeded",
          "Rate limit reached: the pool is above its capacity"),
    500: ("api_error", "server_error", None, "Internal server error"),
    502: ("api_error", "server_error", None, "Bad gateway"),
    503: ("api_error", "server_error", None, "Service unavailable"),
    504: ("timeout_error", "server_error", "timeout", "Gateway timeout: the round was cut"),
    529: ("overloaded_error", "server_error", "overloaded", "Overloaded"),
}
REASONS = {529: "Overloaded", 499: "Client Closed Request"}


def _status_key(status: int) -> str:
    return "5xx" if status in (500, 502, 503) else str(status)
