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
from pathlib import Path
from typing import Any, Mapping

from ._log import get_logger

from .errors import PolicyError

log = get_logger("admission.policy")

#: DESIGN §4 tunables: name -> (default, kind, lower bound, upper bound, inclusive lower).
TUNABLES: dict[str, tuple[float, type, float, float]] = {
    "seed_estimate": (2, float, 1, 1e6),
    "max_estimate": (512, float, 1, 1e6),
    "slow_start_factor": (2, float, 1.0001, 100),
    "slow_start_step": (8, float, 1, 1e6),
    "grow_interval": (15, float, 0.001, 86400),
    "growth_rate": (0.5, float, 0.0001, 10),
    "probe_after": (4, int, 1, 1e6),
    "decrease_factor": (0.7, float, 0.0001, 0.9999),
    "high_free": (0.3, float, 0.0001, 1),
    "lease_ttl": (30, float, 0.1, 1e7),
    "stall_after": (1200, float, 1, 1e7),
    "round_cap": (1800, float, 1, 1e7),
    "starved_after": (900, float, 1, 1e7),
    "probe_every": (10, float, 0.1, 1e6),
    "closed_for": (2100, float, 1, 1e7),
    "aging_unit": (86400, float, 1, 1e9),
    "cost_scale": (1, float, 1e-9, 1e9),
    "health_max_age": (30, float, 0.1, 1e6),
    "decision_ttl": (30, float, 0.1, 86400),
    # a provider's Retry-After pauses its pool at most this long (0: Retry-After is ignored)
    "retry_after_max": (60, float, 0, 3600),
}

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

_RETIRED = re.compile(r"(?i)^(max_?concurren(t|cy)\w*|max_?(rounds|agents|running|in_?flight)|concurrency(_?(cap|limit))?)$")
_TOP_KEYS = {"tunables", "lanes", "providers", "pools", "clock", "tiers", "alternatives", "pins", "agents",
             "ceilings"}
_LANE_KEYS = {"floor", "weight", "priority", "reserve", "pools"}
_PROVIDER_KEYS = {"route", "kind", "daily_limit_usd", "budget_reader", "budget_url", "api_key_env"}
#: Budget readers a provider may name (``admission/budget.py``): how its key's day is read.
BUDGET_READERS = ("openrouter",)
_POOL_KEYS = {"tier", "tokens", "ceilings"}
#: A rate-ceiling scope's limits (``[ceilings.<name>]``, lua/include/ceilings.lua): requests and
#: tokens per minute and per UTC day; each a positive finite number up to MAX_CEILING.
CEILING_LIMITS = ("rpm", "tpm", "itpm", "otpm", "rpd", "tpd")
MAX_CEILING = 1e12
#: How a scope's output tokens are counted: the answer budget on arrival (OpenAI, Azure), or as
#: produced (Anthropic).
OUTPUT_CHARGES = ("max_tokens", "received")
_CEILING_KEYS = set(CEILING_LIMITS) | {"burst_s", "headroom", "output_charge", "cache_reads_count"}
#: A pool's price table (USD per million tokens): the SDK integrations price a call from its
#: ``usage`` with them (admission/integrations/_prices.py) and report it with the release.
PRICE_KEYS = ("price_input", "price_output", "price_cached_input")
MAX_PRICE = 1e6
#: A pool's plane (docs/design.md §8): key -> (kind, lower bound, upper bound); all optional.
PLANE_KEYS: dict[str, tuple[type, float, float]] = {
    "depth_limit": (int, 1, 1e9),          # waiting depth at which borrows of this plane are shed
    "retry_budget": (int, 0, 1e9),         # a finite retry counter (tokens)
    "retry_refill_per_s": (float, 0, 1e6),  # token-bucket refill, from Redis time
    "health_max_age": (float, 0.1, 1e6),   # a sample older than this is not capacity
    "health_every": (float, 0.1, 1e6),     # how often a sampler reads health_url
}
_PLANE_FLAGS = {"health_required"}
_PLANE_URLS = {"health_url"}
_PIN_KEYS = {"lanes", "agents"}
#: The default tiers (DESIGN §7) when a policy has no ``[tiers]``: one per model family token, so
#: the same family on another provider (or a newer version of it) is the fallback, and nothing is
#: guessed across families. ``[tiers]`` replaces them; ``tiers = {}`` turns the defaults off.
DEFAULT_TIERS: dict[str, list[str]] = {"opus": ["opus"], "sonnet": ["sonnet"], "haiku": ["haiku"]}
#: A name (tier, agent, lane, model) holds what lua/include/util.lua's check_name accepts.
_NAME = re.compile(r"^[A-Za-z0-9._\-/:@#]{1,200}$")


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
    route, kind = p.get("route", "global"), p.get("kind", "direct")
    if route not in ("eu", "global"):
        raise PolicyError(f"providers.{name}.route must be 'eu' or 'global', got {route!r}")
    if kind not in ("direct", "router"):
        raise PolicyError(f"providers.{name}.kind must be 'direct' or 'router', got {kind!r}")
    entry = {"route": route, "kind": kind}
    if "daily_limit_usd" in p:
        entry["daily_limit_usd"] = _number(f"providers.{name}.daily_limit_usd", p["daily_limit_usd"], 0, 1e9)
    if "budget_reader" in p:
        if p["budget_reader"] not in BUDGET_READERS:
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
    most 1e12); burst_s in [0.001, 3600] (default 1), headroom in (0, 1] (default 0.97),
    output_charge (default max_tokens), cache_reads_count (default false)."""
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

    entry: dict[str, Any] = {k: num(k, 0, MAX_CEILING, positive=True) for k in CEILING_LIMITS if k in c}
    if not entry:
        errors.append(f"[{where}] sets no limit: give one of {', '.join(CEILING_LIMITS)}")
    entry["burst_s"] = num("burst_s", 0.001, 3600) if "burst_s" in c else 1.0
    entry["headroom"] = num("headroom", 0, 1, positive=True) if "headroom" in c else 0.97
    charge = c.get("output_charge", "max_tokens")
    if charge not in OUTPUT_CHARGES:
        errors.append(f"{where}.output_charge must be one of {', '.join(OUTPUT_CHARGES)}, got {charge!r}")
    entry["output_charge"] = charge
    reads = c.get("cache_reads_count", False)
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
            p[k] = _number(f"pools.{name}.{k}", p[k], 0, MAX_PRICE)
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
        "floor": _number(f"lanes.{name}.floor", l.get("floor", 0), 0, 1),
        "weight": _number(f"lanes.{name}.weight", l.get("weight", 1), 1e-6, 1e6),
        "priority": _number(f"lanes.{name}.priority", l.get("priority", 0), -1e9, 1e9, int),
        "reserve": _number(f"lanes.{name}.reserve", l.get("reserve", DEFAULT_RESERVE.get(name, OTHER_RESERVE)), 0, 1),
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
    clock = raw.get("clock", "server")
    if clock not in CLOCKS:
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
    lanes = _names("pins.lanes", pins.get("lanes", []), empty=True)
    unknown = [x for x in lanes if x not in lane_names]
    if unknown:
        raise PolicyError(f"pins.lanes: {', '.join(unknown)} not declared under [lanes]")
    return {"lanes": lanes, "agents": _names("pins.agents", pins.get("agents", []), empty=True)}


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
