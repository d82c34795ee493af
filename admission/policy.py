"""The policy file: TOML in, a validated and normalized dict out (stored by apply_config.lua).

Everything configured is relative (floors, weights) or a declaration (lanes, providers, pools):
there is no absolute number of concurrent rounds anywhere, and a key that tries to set one is
refused as retired.
"""
from __future__ import annotations

import math
import re
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ._log import get_logger

from .errors import PolicyError

log = get_logger("admission.policy")

#: The seed's budget reserves by lane name (share of the day left when the lane stops).
DEFAULT_RESERVE = {"triage": 0.30, "bugfix": 0.20, "reviews": 0.10, "babysitter": 0.05,
                   "watchdog": 0.05, "express": 0.0}
OTHER_RESERVE = 0.15
MAX_LANES = 1000  # lanes/guaranteed: a lane's rank must fit in 10 bits of its sort key
MAX_POOLS = 1000  # apply_config writes the catalog in one HSET: bounded so it never fails halfway
#: Which clock a mesh's scripts use: Redis' own TIME (production), or a `now` the caller passes
#: (tests and the simulator). One clock per mesh, so a caller's `now` can never judge another
#: pod's lease.
CLOCKS = ("server", "caller")
#: Budget readers a provider may name (``admission/budget.py``): how its key's day is read.
BUDGET_READERS = ("openrouter",)
#: A rate-ceiling scope's limits (``[ceilings.<name>]``, lua/include/ceilings.lua): requests and
#: tokens per minute and per UTC day; each a positive finite number up to MAX_CEILING.
CEILING_LIMITS = ("rpm", "tpm", "itpm", "otpm", "rpd", "tpd")
MAX_CEILING = 1e12
#: How a scope's output tokens are counted: the answer budget on arrival (OpenAI, Azure), or as
#: produced (Anthropic).
OUTPUT_CHARGES = ("max_tokens", "received")
#: A pool's price table (USD per million tokens): the SDK integrations price a call from its
#: ``usage`` with them (admission/integrations/_prices.py) and report it with the release.
PRICE_KEYS = ("price_input", "price_output", "price_cached_input")
MAX_PRICE = 1e6
#: The default tiers (DESIGN §7) when a policy has no ``[tiers]``: one per model family token, so
#: the same family on another provider (or a newer version of it) is the fallback, and nothing is
#: guessed across families. ``[tiers]`` replaces them; ``tiers = {}`` turns the defaults off.
DEFAULT_TIERS: dict[str, list[str]] = {"opus": ["opus"], "sonnet": ["sonnet"], "haiku": ["haiku"]}
#: A name (tier, agent, lane, model) holds what lua/include/util.lua's check_name accepts.
_NAME = re.compile(r"^[A-Za-z0-9._\-/:@#]{1,200}$")


@dataclass(frozen=True)
class Key:
    """One key of the policy file, as ``SCHEMA`` declares it: what it holds (``kind``: float,
    int, bool, str, list, dict, or object for any value), its default (``None``: absent unless given; ``default_doc``
    says it in words where it is not one value), its bounds (``lo``, ``hi``; ``lo_open``: ``lo``
    itself is out) or its ``choices``, and what it means."""

    kind: type
    meaning: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    lo_open: bool = False
    default_doc: str = ""


def _tunable(default: float, kind: type, lo: float, hi: float, meaning: str) -> Key:
    return Key(kind, meaning, default, lo, hi)


#: Every key of the policy file, by table (``""`` is the file's top level; ``lanes.<name>`` stands
#: for each ``[lanes.<name>]`` table, and so on): the one place the validator takes its allowed
#: keys, defaults and bounds from, and ``scripts/docs_reference.py`` the policy reference.
#: A table whose key is written ``<...>`` takes any name there (a map).
SCHEMA: dict[str, dict[str, Key]] = {
    "": {
        "tunables": Key(dict, "the estimate's and the leases' settings (DESIGN §4)", default={},
                        default_doc="every tunable at its default"),
        "lanes": Key(dict, "the lanes, one table each: `[lanes.<name>]`; at least one, at most 1000"),
        "providers": Key(dict, "the providers, one table each: `[providers.<name>]`"),
        "pools": Key(dict, 'the catalog of pools, one table each: `[pools."model@provider"]`; at least one, '
                           "at most 1000"),
        "ceilings": Key(dict, "rate-ceiling scopes, one table each: `[ceilings.<name>]` (DESIGN §5.9)",
                        default={}),
        "clock": Key(str, "which clock the mesh's scripts use: Redis' own TIME (`server`), or the `now` "
                          "each caller passes (`caller`: tests and the simulator)", default="server",
                     choices=CLOCKS),
        "tiers": Key(dict, "tier name -> ordered list of model-id tokens (DESIGN §7); replaces the "
                           "default tiers, `tiers = {}` turns them off", default=DEFAULT_TIERS,
                     default_doc="one tier per family: opus, sonnet, haiku"),
        "alternatives": Key(dict, "model or pool -> the ordered pools a round may move to (replaces the "
                                  "tiers' defaults for it)", default={}),
        "pins": Key(dict, "hard-pinned lanes and agents: their rounds never move to an alternative",
                    default={}),
        "agents": Key(dict, "agent -> its lane (the lane of a round that names no lane)", default={}),
    },
    "tunables": {
        "seed_estimate": _tunable(2, float, 1, 1e6, "K̂ of a pool never seen"),
        "max_estimate": _tunable(512, float, 1, 1e6, "the ceiling of K̂ (and of K); at least seed_estimate"),
        "slow_start_factor": _tunable(2, float, 1.0001, 100, "growth per step before the first measurement"),
        "slow_start_step": _tunable(8, float, 1, 1e6, "most rounds one slow-start step adds"),
        "grow_interval": _tunable(15, float, 0.001, 86400,
                                  "least seconds between growth steps; the pool clock's period"),
        "growth_rate": _tunable(0.5, float, 0.0001, 10, "r of the logistic growth step"),
        "probe_after": _tunable(4, int, 1, 1e6, "growth steps at K before K grows by one"),
        "decrease_factor": _tunable(0.7, float, 0.0001, 0.9999,
                                    "K̂ after a load signal, as a share of the rounds running"),
        "high_free": _tunable(0.3, float, 0.0001, 1, "free share of the pool above which a borrow is certain"),
        "lease_ttl": _tunable(30, float, 0.1, 1e7,
                              "lease of seats and tickets (s); heartbeats come every third of it"),
        "stall_after": _tunable(1200, float, 1, 1e7, "a round running this long (s) reports a stall"),
        "round_cap": _tunable(1800, float, 1, 1e7, "a round running this long (s) is cut, and reports it"),
        "starved_after": _tunable(900, float, 1, 1e7, "seconds after which a waiting lane counts as starving"),
        "probe_every": _tunable(10, float, 0.1, 1e6, "period (s) of the probe round of a closed provider"),
        "closed_for": _tunable(2100, float, 1, 1e7,
                               "how long (s) a credit or key failure closes its provider"),
        "aging_unit": _tunable(86400, float, 1, 1e9, "the time unit (s) of urgency's aging"),
        "cost_scale": _tunable(1, float, 1e-9, 1e9, "how strongly Thompson's choice discounts cost (USD)"),
        "health_max_age": _tunable(30, float, 0.1, 1e6,
                                   "the oldest health sample (s) that still counts (DESIGN §8)"),
        "decision_ttl": _tunable(30, float, 0.1, 86400,
                                 "how long (s) a borrow's refusal is answered again to the same intent"),
        "retry_after_max": _tunable(60, float, 0, 3600,
                                    "the longest (s) a provider's Retry-After pauses its pool (0: ignored)"),
    },
    "lanes.<name>": {
        "floor": Key(float, "the lane's guaranteed share of each pool; the floors sum to at most 1", 0, 0, 1),
        "weight": Key(float, "the lane's weight in the fair share of what is borrowed", 1, 1e-6, 1e6),
        "priority": Key(int, "a higher priority goes first where lanes tie: the fair share, the floors' "
                             "leftover slots", 0, -1e9, 1e9),
        "reserve": Key(float, "share of the provider's daily budget left at which the lane stops "
                              "(`budget-reserve`)", None, 0, 1,
                       default_doc="by name: triage 0.3, bugfix 0.2, reviews 0.1, babysitter and watchdog "
                                   "0.05, express 0; any other lane 0.15"),
        "pools": Key(list, "the only pools the lane may use (names in `[pools]`; non-empty)",
                     default_doc="every pool"),
    },
    "providers.<name>": {
        "route": Key(str, "where the provider sends a request: an EU-routed provider's rounds never move "
                          "to a non-EU router", "global", choices=("eu", "global")),
        "kind": Key(str, "a provider of its own models (`direct`) or a router to others' (`router`)",
                    "direct", choices=("direct", "router")),
        "daily_limit_usd": Key(float, "the provider's budget per UTC day (USD)", None, 0, 1e9,
                               default_doc="no limit"),
        "budget_reader": Key(str, "reads the key's day from the provider (`admission budget sync`); needs "
                                  "budget_url and api_key_env", choices=BUDGET_READERS, default_doc="none"),
        "budget_url": Key(str, "the http(s) URL the budget reader reads", default_doc="none"),
        "api_key_env": Key(str, "the environment variable that holds the key the budget reader sends",
                           default_doc="none"),
    },
    'pools."<model@provider>"': {
        "ceilings": Key(str, "the rate-ceiling scope of the pool: a name under `[ceilings]`",
                        default_doc="none (no rate ceilings)"),
        "price_input": Key(float, "USD per million uncached input tokens (the SDK integrations price a "
                                  "call's usage)", None, 0, MAX_PRICE, default_doc="not priced"),
        "price_output": Key(float, "USD per million output tokens", None, 0, MAX_PRICE, default_doc="not priced"),
        "price_cached_input": Key(float, "USD per million cached input tokens", None, 0, MAX_PRICE,
                                  default_doc="price_input"),
        "depth_limit": Key(int, "the plane's waiting depth at which its borrows are shed (DESIGN §8)",
                           None, 1, 1e9, default_doc="no limit"),
        "retry_budget": Key(int, "the plane's retry budget (tokens)", None, 0, 1e9, default_doc="no budget"),
        "retry_refill_per_s": Key(float, "retry tokens refilled per second, from Redis' time; needs "
                                         "retry_budget", None, 0, 1e6, default_doc="0"),
        "health_max_age": Key(float, "the oldest health sample (s) of the plane that still counts",
                              None, 0.1, 1e6, default_doc="tunables.health_max_age"),
        "health_every": Key(float, "how often (s) a sampler reads health_url", None, 0.1, 1e6,
                            default_doc="a third of the plane's health_max_age"),
        "health_required": Key(bool, "a borrow of the plane needs a fresh health sample", False),
        "health_url": Key(str, "the http(s) URL a health sampler reads (`admission health run`)",
                          default_doc="none"),
        "tier": Key(object, "accepted and stored with the pool; no rule reads it (tiers come from `[tiers]`)",
                    default_doc="none"),
        "tokens": Key(object, "accepted and stored with the pool; no rule reads it (a round declares its "
                           "size at admit)", default_doc="none"),
    },
    "ceilings.<name>": {
        **{k: Key(float, f"{what} the scope may use (at least one limit is set)", None, 0, MAX_CEILING,
                  lo_open=True, default_doc="no limit")
           for k, what in (("rpm", "requests per minute"), ("tpm", "tokens per minute"),
                           ("itpm", "input tokens per minute"), ("otpm", "output tokens per minute"),
                           ("rpd", "requests per UTC day"), ("tpd", "tokens per UTC day"))},
        "burst_s": Key(float, "the request bucket's burst, in seconds of its rate", 1.0, 0.001, 3600),
        "jitter_s": Key(float, "the spread of the delay between an admit and its call's arrival at the provider "
                               "(pods' scheduling, the network): the request bucket keeps that much of its burst "
                               "as room, or spaces calls that much further apart", 0.05, 0, 60),
        "headroom": Key(float, "the share of each limit admission uses", 0.97, 0, 1, lo_open=True),
        "output_charge": Key(str, "output tokens counted as the answer budget on arrival (`max_tokens`: "
                                  "OpenAI, Azure) or as produced (`received`: Anthropic)", "max_tokens",
                             choices=OUTPUT_CHARGES),
        "cache_reads_count": Key(bool, "cache reads count against the input ceilings", False),
    },
    "pins": {
        "lanes": Key(list, "hard-pinned lanes (declared under `[lanes]`)", []),
        "agents": Key(list, "hard-pinned agents", []),
    },
    "tiers": {"<tier>": Key(list, "the tier's model-id tokens in order (case-insensitive substrings of a "
                                  "model id; no model in two tiers)")},
    "alternatives": {'"<model or pool>"': Key(list, "the pools (in `[pools]`) the model's or pool's rounds may "
                                                   "move to, in order; never off the EU route")},
    "agents": {'"<agent>"': Key(str, "the agent's lane (declared under `[lanes]`)")},
}

TUNABLES: dict[str, tuple[float, type, float, float]] = {
    name: (k.default, k.kind, k.lo, k.hi) for name, k in SCHEMA["tunables"].items()}
"""DESIGN §4 tunables: name -> (default, kind, lower bound, upper bound), from ``SCHEMA``."""
_LANE = SCHEMA["lanes.<name>"]
_CEILING = SCHEMA["ceilings.<name>"]
_PROVIDER = SCHEMA["providers.<name>"]
_TOP_KEYS = set(SCHEMA[""])
_LANE_KEYS = set(_LANE)
_PROVIDER_KEYS = set(SCHEMA["providers.<name>"])
_POOL_SCHEMA = SCHEMA['pools."<model@provider>"']
_CEILING_KEYS = set(_CEILING)
#: A pool's plane (docs/design.md §8): key -> (kind, lower bound, upper bound); all optional.
PLANE_KEYS: dict[str, tuple[type, float, float]] = {
    k: (_POOL_SCHEMA[k].kind, _POOL_SCHEMA[k].lo, _POOL_SCHEMA[k].hi)
    for k in ("depth_limit", "retry_budget", "retry_refill_per_s", "health_max_age", "health_every")}
_PLANE_FLAGS = {"health_required"}
_PLANE_URLS = {"health_url"}
_POOL_KEYS = set(_POOL_SCHEMA) - set(PRICE_KEYS) - set(PLANE_KEYS) - _PLANE_FLAGS - _PLANE_URLS
_PIN_KEYS = set(SCHEMA["pins"])
_RETIRED = re.compile(r"(?i)^(max_?concurren(t|cy)\w*|max_?(rounds|agents|running|in_?flight)|concurrency(_?(cap|limit))?)$")


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a policy file."""
    return validate(read(path))


def read(path: str | Path) -> dict[str, Any]:
    """A policy file's TOML, not yet validated; a file that cannot be read is a PolicyError."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise PolicyError(f"policy file {path} not found") from None
    except IsADirectoryError:
        raise PolicyError(f"policy file {path} is a directory, not a TOML file") from None
    except OSError as exc:
        raise PolicyError(f"policy file {path} cannot be read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"policy file {path} is not valid TOML: {exc}") from None


def _retired(where: str, table: Mapping[str, Any]) -> None:
    for k in table:
        if _RETIRED.match(k):
            msg = (f"{where}{k} is retired: admission keeps no absolute number of concurrent rounds; "
                   "it measures each pool (seed-and-grow) and shares it by floors and weights")
            warnings.warn(msg, stacklevel=3)
            log.warning("retired_setting", setting=f"{where}{k}")
            raise PolicyError(msg)


def _unknown(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _number(where: str, v: Any, lo: float, hi: float, kind: type = float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise PolicyError(f"{where} must be a finite number, got {v!r}")
    if kind is int and v != int(v):
        raise PolicyError(f"{where} must be a whole number, got {v!r}")
    if not lo <= v <= hi:
        raise PolicyError(f"{where} must be in [{lo}, {hi}], got {v!r}")
    return kind(v)


def _key(where: str, table: Mapping[str, Any], name: str, schema: Mapping[str, Key], default: Any = None) -> float:
    """The number ``table[name]`` (else its default) within the bounds ``schema`` declares for it."""
    k = schema[name]
    return _number(f"{where}.{name}", table.get(name, k.default if default is None else default), k.lo, k.hi, k.kind)


def _table(where: str, v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise PolicyError(f"{where} must be a table, got {type(v).__name__}")
    return v


def validate(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Check a policy (as read from TOML) and return its normalized form."""
    raw = _table("policy", raw)
    _retired("", raw)
    _unknown("policy", raw, _TOP_KEYS)

    tun = _table("[tunables]", raw.get("tunables", {}))
    _retired("tunables.", tun)
    _unknown("[tunables]", tun, set(TUNABLES))
    tunables = {name: _number(f"tunables.{name}", tun.get(name, d), lo, hi, kind)
                for name, (d, kind, lo, hi) in TUNABLES.items()}
    if tunables["max_estimate"] < tunables["seed_estimate"]:
        raise PolicyError("tunables.max_estimate must be >= tunables.seed_estimate")

    providers = {name: _provider(name, p) for name, p in _table("[providers]", raw.get("providers", {})).items()}
    ceilings = {name: _ceiling(name, c) for name, c in _table("[ceilings]", raw.get("ceilings", {})).items()}
    pools = [_pool(name, p, providers, ceilings) for name, p in _table("[pools]", raw.get("pools", {})).items()]
    _pool_count(pools)
    catalog = {p["name"] for p in pools}
    lanes = [_lane(name, l, catalog) for name, l in _table("[lanes]", raw.get("lanes", {})).items()]
    _lane_count(lanes)
    _floors(lanes)
    lanes.sort(key=lambda l: (-l["priority"], l["name"]))
    clock = _clock(raw)
    lane_names = {l["name"] for l in lanes}
    tiers = _tiers(raw.get("tiers", DEFAULT_TIERS), pools)
    alternatives = _alternatives(raw.get("alternatives", {}), pools, providers)
    pins = _pins(raw.get("pins", {}), lane_names)
    agents = _agents(raw.get("agents", {}), lane_names)
    out = {"tunables": tunables, "lanes": lanes, "providers": providers, "pools": pools, "clock": clock,
           "tiers": tiers, "alternatives": alternatives, "pins": pins, "agents": agents}
    if ceilings:  # a policy without ceilings stays as it was
        out["ceilings"] = ceilings
    return out


def problems(raw: Any) -> list[str]:
    """Every error of a policy (as read from TOML) at once, [] for a valid one: ``validate``
    stops at the first. Each section, table and entry is checked on its own; an entry in error
    still counts as declared for the checks that name it, so one mistake is reported once."""
    found: list[str] = []

    def check(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except PolicyError as exc:
            found.append(str(exc))
            return None

    if not isinstance(raw, Mapping):
        return [f"policy must be a table, got {type(raw).__name__}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a retired key is an error here, reported below
        for k in raw:
            check(_retired, "", {k: None})
        check(_unknown, "policy", {k: None for k in raw if not _RETIRED.match(k)}, _TOP_KEYS)
        tun = check(_table, "[tunables]", raw.get("tunables", {})) or {}
        for k in tun:
            check(_retired, "tunables.", {k: None})
        check(_unknown, "[tunables]", {k: None for k in tun if not _RETIRED.match(k)}, set(TUNABLES))
        tunables = {name: check(_number, f"tunables.{name}", tun.get(name, d), lo, hi, kind)
                    for name, (d, kind, lo, hi) in TUNABLES.items()}
        if None not in (tunables["max_estimate"], tunables["seed_estimate"]) \
                and tunables["max_estimate"] < tunables["seed_estimate"]:
            found.append("tunables.max_estimate must be >= tunables.seed_estimate")
        # a provider, pool or lane in error stays declared (as the plainest entry of its kind)
        plain_provider = {"route": "global", "kind": "direct"}
        providers = {name: check(_provider, name, p) or plain_provider
                     for name, p in (check(_table, "[providers]", raw.get("providers", {})) or {}).items()}
        # a scope in error stays declared: a pool naming it is not reported again
        ceilings = {name: check(_ceiling, name, c) or {}
                    for name, c in (check(_table, "[ceilings]", raw.get("ceilings", {})) or {}).items()}
        raw_pools = check(_table, "[pools]", raw.get("pools", {})) or {}
        pools = []
        for name, p in raw_pools.items():
            pool = check(_pool, name, p, providers, ceilings)
            model, _, provider = str(name).rpartition("@")
            if pool is None and model and provider in providers:
                pool = {"name": name, "provider": provider}
            if pool is not None:
                pools.append(pool)
        check(_pool_count, list(raw_pools))
        catalog = {p["name"] for p in pools}
        lanes = [check(_lane, name, l, catalog) or {"name": name, "floor": _floor_or_0(l)}
                 for name, l in (check(_table, "[lanes]", raw.get("lanes", {})) or {}).items()]
        check(_lane_count, lanes)
        check(_floors, lanes)
        check(_clock, raw)
        lane_names = {l["name"] for l in lanes}
        check(_tiers, raw.get("tiers", DEFAULT_TIERS), pools)
        check(_alternatives, raw.get("alternatives", {}), pools, providers)
        check(_pins, raw.get("pins", {}), lane_names)
        check(_agents, raw.get("agents", {}), lane_names)
    return found


def _floor_or_0(l: Any) -> float:
    """A lane in error keeps its floor for the sum of floors when the floor itself is right."""
    floor = l.get("floor", 0) if isinstance(l, Mapping) else 0
    ok = isinstance(floor, (int, float)) and not isinstance(floor, bool) and math.isfinite(floor) and 0 <= floor <= 1
    return float(floor) if ok else 0.0


def _provider(name: str, p: Any) -> dict[str, Any]:
    """One ``[providers.<name>]`` entry, checked and normalized."""
    p = _table(f"[providers.{name}]", p)
    _retired(f"providers.{name}.", p)
    _unknown(f"[providers.{name}]", p, _PROVIDER_KEYS)
    route, kind = p.get("route", _PROVIDER["route"].default), p.get("kind", _PROVIDER["kind"].default)
    if route not in _PROVIDER["route"].choices:
        raise PolicyError(f"providers.{name}.route must be 'eu' or 'global', got {route!r}")
    if kind not in _PROVIDER["kind"].choices:
        raise PolicyError(f"providers.{name}.kind must be 'direct' or 'router', got {kind!r}")
    entry = {"route": route, "kind": kind}
    if "daily_limit_usd" in p:
        entry["daily_limit_usd"] = _key(f"providers.{name}", p, "daily_limit_usd", _PROVIDER)
    if "budget_reader" in p:
        if p["budget_reader"] not in _PROVIDER["budget_reader"].choices:
            raise PolicyError(f"providers.{name}.budget_reader must be one of {', '.join(BUDGET_READERS)}, "
                              f"got {p['budget_reader']!r}")
        url, env = p.get("budget_url"), p.get("api_key_env")
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise PolicyError(f"providers.{name}.budget_url must be an http(s) URL, got {url!r}")
        if not isinstance(env, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", env):
            raise PolicyError(f"providers.{name}.api_key_env must name an environment variable, got {env!r}")
        entry.update(budget_reader=p["budget_reader"], budget_url=url, api_key_env=env)
    elif "budget_url" in p or "api_key_env" in p:
        raise PolicyError(f"providers.{name}: budget_url and api_key_env need a budget_reader")
    return entry


def _ceiling(name: str, c: Any) -> dict[str, Any]:
    """One ``[ceilings.<name>]`` scope: at least one limit, each a positive finite number (at
    most 1e12); burst_s in [0.001, 3600] (default 1), jitter_s in [0, 60] (default 0.05),
    headroom in (0, 1] (default 0.97), output_charge (default max_tokens), cache_reads_count
    (default false)."""
    where = f"ceilings.{name}"
    _name("[ceilings]", name)
    c = _table(f"[{where}]", c)
    _unknown(f"[{where}]", c, _CEILING_KEYS)
    errors: list[str] = []

    def num(k: str, lo: float, hi: float, positive: bool = False) -> float | None:
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            errors.append(f"{where}.{k} must be a finite number, got {v!r}")
        elif (positive and v <= lo) or v < lo or v > hi:
            errors.append(f"{where}.{k} must be in {'(' if positive else '['}{lo:g}, {hi:g}], got {v!r}")
        else:
            return float(v)
        return None

    def bounded(k: str) -> float | None:
        key = _CEILING[k]
        return num(k, key.lo, key.hi, positive=key.lo_open) if k in c else key.default

    entry: dict[str, Any] = {k: bounded(k) for k in CEILING_LIMITS if k in c}
    if not entry:
        errors.append(f"[{where}] sets no limit: give one of {', '.join(CEILING_LIMITS)}")
    entry["burst_s"] = bounded("burst_s")
    entry["jitter_s"] = bounded("jitter_s")
    entry["headroom"] = bounded("headroom")
    charge = c.get("output_charge", _CEILING["output_charge"].default)
    if charge not in _CEILING["output_charge"].choices:
        errors.append(f"{where}.output_charge must be one of {', '.join(OUTPUT_CHARGES)}, got {charge!r}")
    entry["output_charge"] = charge
    reads = c.get("cache_reads_count", _CEILING["cache_reads_count"].default)
    if not isinstance(reads, bool):
        errors.append(f"{where}.cache_reads_count must be true or false, got {reads!r}")
    entry["cache_reads_count"] = reads
    if errors:
        raise PolicyError("; ".join(errors))
    return entry


def _pool(name: str, p: Any, providers: Mapping[str, Any],
          ceilings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One ``[pools."model@provider"]`` entry (its provider declared, its ceilings scope under
    ``[ceilings]``), checked and normalized."""
    p = _table(f'[pools."{name}"]', p)
    _retired(f"pools.{name}.", p)
    _unknown(f'[pools."{name}"]', p, _POOL_KEYS | set(PRICE_KEYS) | set(PLANE_KEYS) | _PLANE_FLAGS | _PLANE_URLS)
    p = {**p, **_plane(name, p)}
    for k in PRICE_KEYS:
        if k in p:
            p[k] = _key(f"pools.{name}", p, k, _POOL_SCHEMA)
    model, at, provider = name.rpartition("@")
    if not at or not model or not provider:
        raise PolicyError(f'pool "{name}" must be written model@provider')
    if provider not in providers:
        raise PolicyError(f'pool "{name}": provider {provider!r} is not declared under [providers.{provider}]')
    if "ceilings" in p and (not isinstance(p["ceilings"], str) or p["ceilings"] not in (ceilings or {})):
        raise PolicyError(f'pools."{name}".ceilings: {p["ceilings"]!r} is not a scope declared under '
                          f'[ceilings.<name>]')
    return {"name": name, "provider": provider, **p}


def _pool_count(pools: list[Any]) -> None:
    if not pools:
        raise PolicyError('policy needs at least one pool: [pools."model@provider"]')
    if len(pools) > MAX_POOLS:
        raise PolicyError(f"policy has {len(pools)} pools; at most {MAX_POOLS}")


def _lane(name: str, l: Any, catalog: set[str]) -> dict[str, Any]:
    """One ``[lanes.<name>]`` entry, checked and normalized (its pools in the catalog)."""
    l = _table(f"[lanes.{name}]", l)
    _retired(f"lanes.{name}.", l)
    _unknown(f"[lanes.{name}]", l, _LANE_KEYS)
    lane = {
        "name": name,
        **{k: _key(f"lanes.{name}", l, k, _LANE) for k in ("floor", "weight", "priority")},
        "reserve": _key(f"lanes.{name}", l, "reserve", _LANE, DEFAULT_RESERVE.get(name, OTHER_RESERVE)),
    }
    if "pools" in l:
        own = l["pools"]
        if not isinstance(own, list) or not own or not all(isinstance(x, str) for x in own):
            raise PolicyError(f"lanes.{name}.pools must be a non-empty list of pool names")
        missing = [x for x in own if x not in catalog]
        if missing:
            raise PolicyError(f"lanes.{name}.pools: {', '.join(missing)} not in [pools]")
        lane["pools"] = own
    return lane


def _lane_count(lanes: list[dict[str, Any]]) -> None:
    if not lanes:
        raise PolicyError("policy needs at least one lane: [lanes.<name>]")
    if len(lanes) > MAX_LANES:
        raise PolicyError(f"policy has {len(lanes)} lanes; at most {MAX_LANES} (a decision is O(lanes))")


def _floors(lanes: list[dict[str, Any]]) -> None:
    total = sum(l["floor"] for l in lanes)
    if total > 1 + 1e-9:
        raise PolicyError(f"lane floors are shares of a pool and must sum to <= 1, got {total:g}")


def _clock(raw: Mapping[str, Any]) -> str:
    clock = raw.get("clock", SCHEMA[""]["clock"].default)
    if clock not in SCHEMA[""]["clock"].choices:
        raise PolicyError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    return clock


def _plane(pool: str, p: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's plane settings, checked (the fence, docs/design.md §8)."""
    out: dict[str, Any] = {}
    for k, (kind, lo, hi) in PLANE_KEYS.items():
        if k in p:
            out[k] = _number(f'pools."{pool}".{k}', p[k], lo, hi, kind)
    if "health_required" in p:
        if not isinstance(p["health_required"], bool):
            raise PolicyError(f'pools."{pool}".health_required must be true or false, got {p["health_required"]!r}')
        out["health_required"] = p["health_required"]
    if "health_url" in p:
        url = p["health_url"]
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise PolicyError(f'pools."{pool}".health_url must be an http(s) URL, got {url!r}')
        out["health_url"] = url
    if "retry_refill_per_s" in out and "retry_budget" not in out:
        raise PolicyError(f'pools."{pool}".retry_refill_per_s needs a retry_budget')
    return out


def _name(where: str, v: Any) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise PolicyError(f"{where}: name {v!r} must be 1-200 characters, only letters, digits and . _ - / : @ #")
    return v


def _names(where: str, v: Any, *, empty: bool = False) -> list[str]:
    if not isinstance(v, list) or (not v and not empty):
        raise PolicyError(f"{where} must be a {'' if empty else 'non-empty '}list of names, got {v!r}")
    out = [_name(where, x) for x in v]
    dup = sorted({x for x in out if out.count(x) > 1})
    if dup:
        raise PolicyError(f"{where}: {', '.join(dup)} listed twice")
    return out


def model_of(pool: str) -> str:
    """The model of a pool name ``model@provider`` (the part before the last '@')."""
    return pool.rpartition("@")[0]


def tier_of(model: str, tiers: Mapping[str, list[str]]) -> tuple[str, int] | None:
    """The tier whose token ``model`` carries (case-insensitive substring) and the index of
    the first such token in that tier's list; None for a model in no tier."""
    low = model.lower()
    for name, tokens in tiers.items():
        for i, tok in enumerate(tokens):
            if tok.lower() in low:
                return name, i
    return None


def _tiers(raw: Any, pools: list[dict[str, Any]]) -> dict[str, list[str]]:
    """[tiers]: tier name -> ordered, non-empty list of model-id tokens; no model in two tiers."""
    tiers: dict[str, list[str]] = {}
    for name, tokens in _table("[tiers]", raw).items():
        _name("[tiers]", name)
        if (not isinstance(tokens, list) or not tokens
                or not all(isinstance(t, str) and t.strip() for t in tokens)):
            raise PolicyError(f"tiers.{name} must be a non-empty list of model-id tokens (strings), got {tokens!r}")
        lows = [t.lower() for t in tokens]
        dup = sorted({t for t in lows if lows.count(t) > 1})
        if dup:
            raise PolicyError(f"tiers.{name}: token(s) {', '.join(dup)} listed twice")
        tiers[name] = list(tokens)
    for model in sorted({model_of(p["name"]) for p in pools}):
        hits = [t for t, tokens in tiers.items() if any(tok.lower() in model.lower() for tok in tokens)]
        if len(hits) > 1:
            raise PolicyError(f"model {model!r} is in two tiers ({', '.join(hits)}): "
                              "its id carries a token of each; make the tokens distinct")
    return tiers


def may_move_to(src: Mapping[str, Any], dst: Mapping[str, Any]) -> bool:
    """MayMoveTo: may a round leave a pool of provider ``src`` for a pool of provider ``dst``
    (each a normalized provider: ``route``, ``kind``)? Never off the EU route: from an EU-routed
    provider only to another EU-routed provider or a direct provider, never to a non-EU router.
    From a global provider anywhere."""
    if src["route"] != "eu":
        return True
    return dst["route"] == "eu" or dst["kind"] == "direct"


def _alternatives(raw: Any, pools: list[dict[str, Any]],
                  providers: Mapping[str, Any]) -> dict[str, list[str]]:
    """[alternatives]: model or pool -> ordered list of catalog pools (replaces the defaults)."""
    catalog = {p["name"]: p["provider"] for p in pools}
    models = {model_of(p) for p in catalog}
    out: dict[str, list[str]] = {}
    for key, lst in _table("[alternatives]", raw).items():
        where = f'alternatives."{key}"'
        _name("[alternatives]", key)
        if "@" in key and key not in catalog:
            raise PolicyError(f"{where}: pool {key!r} is not in [pools]")
        if "@" not in key and key not in models:
            raise PolicyError(f"{where}: model {key!r} is the model of no pool in [pools]")
        alts = _names(where, lst, empty=True)
        missing = [x for x in alts if x not in catalog]
        if missing:
            raise PolicyError(f"{where}: {', '.join(missing)} not in [pools]")
        if key in alts:
            raise PolicyError(f"{where}: a pool may not list itself as its alternative")
        if key in catalog:
            off = [x for x in alts if not may_move_to(providers[catalog[key]], providers[catalog[x]])]
            if off:
                raise PolicyError(f"{where}: {', '.join(off)} would take an EU-routed pool to a non-EU router")
        out[key] = alts
    return out


def _pins(raw: Any, lane_names: set[str]) -> dict[str, list[str]]:
    """[pins]: hard-pinned lanes (declared) and agents."""
    pins = _table("[pins]", raw)
    _unknown("[pins]", pins, _PIN_KEYS)
    lanes = _names("pins.lanes", pins.get("lanes", SCHEMA["pins"]["lanes"].default), empty=True)
    unknown = [x for x in lanes if x not in lane_names]
    if unknown:
        raise PolicyError(f"pins.lanes: {', '.join(unknown)} not declared under [lanes]")
    return {"lanes": lanes, "agents": _names("pins.agents", pins.get("agents", SCHEMA["pins"]["agents"].default),
                                             empty=True)}


def _agents(raw: Any, lane_names: set[str]) -> dict[str, str]:
    """[agents]: agent -> its lane (laneOfAgent); the lane must be declared."""
    out: dict[str, str] = {}
    for agent, lane in _table("[agents]", raw).items():
        _name("[agents]", agent)
        if not isinstance(lane, str):
            raise PolicyError(f'agents."{agent}" must name a lane, got {lane!r}')
        _name(f'agents."{agent}"', lane)
        if lane not in lane_names:
            raise PolicyError(f'agents."{agent}": lane {lane!r} is not declared under [lanes]')
        out[agent] = lane
    return out
