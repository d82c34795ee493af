"""``/``: the live census page. Every table is built here, from the census; the page's script
(static/page.js) refreshes them by fetching the page again, and draws each pool's K̂ and K over
time. The HTML, the script and the style are package files (static/), inlined with the request's
nonce: the page loads no external asset."""
from __future__ import annotations

import functools
import html
import json
import time
from importlib import resources
from string import Template
from typing import Any
from urllib.parse import quote

from ..view import estimate_state, plane_text
from .source import number as _num

POLL_MS = 2000
HISTORY_POINTS = 900  # 30 minutes at one point per 2 s


@functools.cache
def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return str(int(x)) if x == int(x) else f"{x:.1f}"
    return str(x)


def _usd(x: Any) -> str:
    return "–" if x is None else f"${_num(x):,.2f}"


def _utc(t: Any, fmt: str = "%H:%M:%S") -> str:
    return time.strftime(fmt, time.gmtime(_num(t))) + "Z" if t else "–"


def _ago(now: Any, since: Any) -> str:
    return f"{max(0.0, _num(now) - _num(since)):.0f}s" if since else "–"


def _pool_state(p: dict[str, Any]) -> str:
    state = estimate_state(p)
    return f"paused until {_utc(p['pausedUntil'])} (Retry-After), {state}" if p.get("pausedUntil") else state


def _closed(p: dict[str, Any]) -> str:
    if not p.get("closedUntil"):
        return "open"
    return f"closed ({p.get('closedWhy') or '?'}) until {_utc(p['closedUntil'], '%Y-%m-%d %H:%M')}"


def _budget(p: dict[str, Any]) -> str:
    if p.get("budgetLimitUsd") is None:
        return "no budget today"
    left = _num(p["budgetLimitUsd"]) - _num(p.get("budgetSpentUsd")) - _num(p.get("committedUsd"))
    return (f"{_usd(p.get('budgetSpentUsd'))} + {_usd(p.get('committedUsd'))} in flight of "
            f"{_usd(p['budgetLimitUsd'])} (left {_usd(left)})")


def _plane(p: dict[str, Any]) -> str:
    return plane_text(p["plane"]) if p.get("plane") else "–"


def _starving_text(s: dict[str, Any]) -> str:
    kind = s.get("kind")
    if kind == "provider-closed":
        return (f"provider {s.get('provider')} closed ({s.get('why')}) with {s.get('waiting')} waiting on "
                f"{s.get('pool')} until {_utc(s.get('closedUntil'), '%Y-%m-%d %H:%M')}")
    if kind == "pinned":
        return (f"{s.get('waiting')} hard-pinned round(s) waiting for {s.get('pool')} since "
                f"{_utc(s.get('waitingSince'))}")
    return f"{kind}: lane {s.get('lane')} on {s.get('pool')} waiting since {_utc(s.get('waitingSince'))}"


def _attrs(**kv: Any) -> str:
    return "".join(f' {k.replace("_", "-")}="{_e(v)}"' for k, v in kv.items() if v is not None)


def _row(cells: list[Any], after: str = "", **attrs: Any) -> str:
    """A table row of escaped cells (``after``: markup of the row's own, after them)."""
    return f"<tr{_attrs(**attrs)}>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + after + "</tr>"


def _item(text: str, **attrs: Any) -> str:
    return f"<li{_attrs(**attrs)}>{_e(text)}</li>"


def _rows_pools(doc: dict[str, Any]) -> str:
    rows = []
    for p in doc.get("pools", []):
        cells = [p.get("pool"), p.get("provider"), _fmt(p.get("capacity")),
                 _fmt(p.get("carryingCapacity")) if p.get("carryingCapacity") else "–", _fmt(p.get("slots")),
                 _fmt(p.get("running")), _fmt(p.get("waiting")), _fmt(p.get("free")), _pool_state(p),
                 _closed(p), _budget(p), _plane(p)]
        klass = "closed" if p.get("closedUntil") else ("exhausted" if p.get("exhausted") else "")
        spark = (f'<td><svg class="spark"{_attrs(data_pool=p.get("pool"))} width="180" height="36" '
                 f'viewBox="0 0 180 36" role="img" aria-label="K-hat and K over time"></svg></td>')
        rows.append(_row(cells, spark, data_pool=p.get("pool"), **{"class": klass or None}))
    return "".join(rows) or '<tr class="none"><td colspan="13">no pools</td></tr>'


def _rows_lanes(doc: dict[str, Any]) -> str:
    rows = []
    for p in doc.get("pools", []):
        for l in p.get("lanes", []):
            cells = [p.get("pool"), l.get("lane"), _fmt(l.get("running")), _fmt(l.get("waiting")),
                     _fmt(l.get("guaranteed")), _fmt(l.get("borrowed")), _fmt(l.get("bound")),
                     _fmt(l.get("delegated")), _usd(l.get("spentTodayUsd")), _usd(l.get("reserveLeftUsd")),
                     _ago(doc.get("at"), l.get("oldestWaitingSince"))]
            rows.append(_row(cells, data_pool=p.get("pool"), data_lane=l.get("lane")))
    return "".join(rows) or '<tr class="none"><td colspan="11">no lane has work</td></tr>'


def _providers(doc: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    seen: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for p in doc.get("pools", []):
        pools, _first = seen.setdefault(str(p.get("provider")), ([], p))
        pools.append(str(p.get("pool")))
    return [(name, pools, first) for name, (pools, first) in seen.items()]


def _rows_providers(doc: dict[str, Any]) -> str:
    rows = [_row([name, ", ".join(pools), _closed(p), _budget(p),
                  _utc(p.get("budgetAt"), "%H:%M") if p.get("budgetAt") else "–"],
                 data_provider=name, **{"class": "closed" if p.get("closedUntil") else None})
            for name, pools, p in _providers(doc)]
    return "".join(rows) or '<tr class="none"><td colspan="5">no providers</td></tr>'


def _rows_ceilings(doc: dict[str, Any]) -> str:
    """One row per limit of each rate-ceiling scope; the scope's own figures on each of its rows
    (its requests on a request limit, its tokens on a token limit)."""
    rows = []
    for c in doc.get("ceilings") or []:
        used, acc, reading = c.get("usedLastMinute") or {}, c.get("accuracy"), c.get("reading")
        refused = c.get("refusals") or {}
        for lim in c.get("limits") or []:
            name = str(lim.get("limit"))
            requests = name in ("rpm", "rpd") or "request" in name
            in_flight = c.get("reservedRequests") if requests else c.get("reservedTokens")
            last = used.get("requests") if requests else used.get("tokens")
            level = lim.get("level")
            cells = [c.get("scope"), ", ".join(c.get("pools") or []), name,
                     f"{_fmt(lim.get('configured'))} / {_fmt(lim.get('learned'))}", _fmt(_num(lim.get("effective"))),
                     "–" if level is None else f"{_fmt(float(round(_num(level))))} of {_fmt(lim.get('capacity'))}"
                     + (" (held)" if lim.get("heldUntil") else ""),
                     _fmt(float(round(_num(in_flight)))), _fmt(float(round(_num(last)))),
                     f"{_num(c.get('waitSeconds')):.1f}s" + (" (closed)" if c.get("closedUntil") else ""),
                     _fmt(refused.get(f"ceiling-{name}", 0)),
                     f"{_num(acc.get('median')):.2f} / {_num(acc.get('p95')):.2f}" if acc else "–",
                     f"{_num(reading.get('ageSeconds')):.0f}s ago" if reading else "–"]
            klass = "closed" if c.get("closedUntil") else ("held" if lim.get("heldUntil") else None)
            rows.append(_row(cells, data_scope=c.get("scope"), data_limit=name, **{"class": klass}))
    return "".join(rows) or '<tr class="none"><td colspan="12">no rate ceilings</td></tr>'


def _items_starving(doc: dict[str, Any]) -> str:
    items = [_item(_starving_text(s), data_kind=s.get("kind"), data_pool=s.get("pool"), data_lane=s.get("lane"),
                   data_provider=s.get("provider")) for s in doc.get("starving", [])]
    return "".join(items) or '<li class="none">nobody is starving</li>'


def _items_must_yield(doc: dict[str, Any]) -> str:
    items = [_item(f"{y.get('lane')} on {p.get('pool')}: {_fmt(y.get('borrowed'))} borrowed, yields at its next "
                   f"round (pool owes {_fmt(p.get('owed'))})", data_pool=p.get("pool"), data_lane=y.get("lane"))
             for p in doc.get("pools", []) for y in p.get("mustYield", [])]
    return "".join(items) or '<li class="none">no lane must yield</li>'


def _updated(doc: dict[str, Any] | None, error: str | None) -> str:
    if doc is None:
        return f"census unavailable: {error}"
    return f"census of {_utc(doc.get('at'))} (policy v{_fmt(doc.get('configVersion'))})"


def _script_json(x: Any) -> str:
    """JSON safe inside a <script> element."""
    return (json.dumps(x).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_page(mesh: str, meshes: list[str], doc: dict[str, Any] | None, error: str | None = None,
                nonce: str = "") -> str:
    """The live census page, its tables rendered from ``doc`` (None: the census could not be
    read, ``error`` says why)."""
    nav = ""
    if len(meshes) > 1:
        links = [f'<a href="?mesh={_e(quote(m, safe=""))}"{_attrs(aria_current="page" if m == mesh else None)}>'
                 f'{_e(m)}</a>' for m in meshes]
        nav = "<nav>meshes: " + " ".join(links) + "</nav>"
    d = doc or {"pools": [], "starving": []}
    return Template(_static("page.html")).substitute(
        mesh=_e(mesh), mesh_query=_e(quote(mesh, safe="")), nav=nav, nonce=_attrs(nonce=nonce or None),
        updated=_e(_updated(doc, error)), poll_seconds=POLL_MS // 1000,
        updated_attrs=_attrs(data_at=d.get("at"), **{"class": "stale" if doc is None else None}),
        pools=_rows_pools(d), lanes=_rows_lanes(d), providers=_rows_providers(d), ceilings=_rows_ceilings(d),
        starving=_items_starving(d), must_yield=_items_must_yield(d), css=_static("page.css"),
        script=_static("page.js"),
        initial=_script_json({"mesh": mesh, "census": doc, "pollMs": POLL_MS, "historyPoints": HISTORY_POINTS}))
