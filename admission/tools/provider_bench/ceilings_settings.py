"""The ceilings case's settings: the provider keys (their rate ceilings), the contenders, the
workload and the admission's policies (``admission bench --provider --case ceilings``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..sim import ceilings as C
from ...policy import TUNABLES
from .settings import LANE, POOL, PROVIDER, scaled_tunables


@dataclass(frozen=True)
class Key:
    """One provider key as the fake provider enforces it (``sim/ceilings.py`` counts it)."""

    name: str
    about: str
    limits: dict[str, float]
    style: str = "openai"
    outside: dict[str, float] = field(default_factory=dict)  # per provider minute, from outside the mesh
    cache_read_share: float = 0.0
    rpm_burst_s: float = 1.0  # "60 RPM may be enforced as 1 request per second"
    # the provider lowers these limits at the start of this provider minute of the run (Azure
    # lowering a deployment's quota); nothing tells the admission but the next response's headers
    lowered: dict[str, float] = field(default_factory=dict)
    lower_minute: int = 0
    # a key with a daily cap: the scope's headroom (1: every request of the day is used) and an
    # alternative pool on a key of its own, where the callers can move when the day is spent
    headroom: float | None = None
    alternative: bool = False
    # one pod process is SIGKILLed at the start of this provider minute of the run (0: none); its
    # leases are scaled like the provider's durations (30 provider seconds), so a dead pod's seats
    # and waiters end as they would in real time, not after five provider minutes
    kill_minute: int = 0

    @property
    def change_minute(self) -> int | None:
        """The minute the run changes (a lowered limit, a pod killed), or None."""
        return self.lower_minute if self.lowered else (self.kill_minute or None)


KEYS = {
    "openai": Key("openai", "60 RPM, 100k TPM (OpenAI style)", {"rpm": 60.0, "tpm": 100_000.0}),
    "anthropic": Key("anthropic", "50 RPM, 30k ITPM, 8k OTPM (Anthropic style, 70 % cache reads)",
                     {"rpm": 50.0, "itpm": 30_000.0, "otpm": 8_000.0}, style="anthropic", cache_read_share=0.7),
    "outside": Key("outside", "60 RPM, 100k TPM, 30 % spent from outside the mesh",
                   {"rpm": 60.0, "tpm": 100_000.0}, outside={"tpm": 30_000.0}),
    "daily": Key("daily", "1,000 requests a day, and an alternative pool on another key",
                 {"rpd": 1_000.0}, headroom=1.0, alternative=True),
    "killed": Key("killed", "60 RPM, 100k TPM, one of the pods killed (SIGKILL) at minute 4, its rounds held",
                  {"rpm": 60.0, "tpm": 100_000.0}, kill_minute=4),
    "lowered": Key("lowered", "60 RPM, 100k TPM, lowered to 50k TPM at minute 5 (as Azure lowers a deployment)",
                   {"rpm": 60.0, "tpm": 100_000.0}, lowered={"tpm": 50_000.0}, lower_minute=5),
}
#: the contenders, in their order in the table; "headers": the admission learning the ceilings from
#: the providers' headers alone (its policy declares none)
CONTENDERS = ("none", "admission", "ceilings", "headers", "litellm")
DEFAULT_CONTENDERS = CONTENDERS
LABELS = {"none": "no admission (retry-after / backoff)", "admission": "admission, no ceilings",
          "ceilings": "admission, ceilings configured", "litellm": "LiteLLM Router (usage-based v2, shared Redis)",
          "headers": "admission, learning from headers only"}
SCOPE = "key"
#: the measured window starts at this provider minute of the run (minutes 2 to the end)
WARMUP_MINUTES = 2
#: what each call sends: a prompt of 1k-3k tokens (4 characters a token, as the fake provider
#: counts them, and one cl100k token per " abc" as LiteLLM's counter does) and an answer budget
PROMPT = (1_000, 3_000)
MAX_TOKENS = 1_024
#: the clients' backoff without a retry-after: full jitter, provider seconds (scaled to real)
BACKOFF_BASE, BACKOFF_CAP = 1.0, 30.0


@dataclass(frozen=True)
class CeilingSettings:
    keys: tuple[str, ...] = ("openai", "anthropic", "outside")
    contenders: tuple[str, ...] = DEFAULT_CONTENDERS
    pods: int = 4
    workers: int = 16            # threads per pod
    minutes: float = 10.0        # provider minutes per contender
    scale: float = 10.0          # provider seconds per real second
    seed: int = 1
    engine: str = "redis"

    @property
    def real_s(self) -> float:
        return self.minutes * 60.0 / self.scale


#: a daily key's alternative: another model of the fake provider (a key and scope of its own)
ALT_MODEL = "m-alt"
ALT_POOL = f"{ALT_MODEL}@{PROVIDER}"
#: the model each pod calls once before the start (ceilings_pods.warm_up): buckets of its own
WARMUP_MODEL = "m-warmup"


def admission_policy(key: Key, s: CeilingSettings, contender: str) -> dict[str, Any]:
    """One lane owning the pool; the provider's durations scaled (as the burst's); with
    ``ceilings`` the key's limits as ``[ceilings.key]``, per real minute (the provider's per
    provider minute × scale; a daily limit as it is: the admission's day is Redis' UTC day), the
    request bucket's burst one provider second. A key with an alternative: its pool is the
    lane's first choice and the alternative (the same limits on a scope of its own) the second."""
    pol: dict[str, Any] = {"tunables": scaled_tunables(s.scale),
                           "lanes": {LANE: {"floor": 1.0, "weight": 1, "priority": 1}},
                           "providers": {PROVIDER: {}}, "pools": {POOL: {}}}
    if key.kill_minute:
        pol["tunables"]["lease_ttl"] = round(TUNABLES["lease_ttl"][0] / s.scale, 6)
    if key.alternative:
        pol["pools"][ALT_POOL] = {}
        pol["alternatives"] = {POOL: [ALT_POOL]}
    if contender == "ceilings":
        scope: dict[str, Any] = {kind: limit * (1 if kind in C.DAY_KINDS else s.scale)
                                 for kind, limit in key.limits.items()}
        if key.headroom is not None:
            scope["headroom"] = key.headroom
        if "rpm" in scope:
            scope["burst_s"] = max(0.001, key.rpm_burst_s / s.scale)
        if key.style == "anthropic":
            scope["output_charge"] = "received"
        pol["ceilings"] = {SCOPE: scope}
        pol["pools"][POOL]["ceilings"] = SCOPE
        if key.alternative:
            pol["ceilings"]["alt"] = dict(scope)
            pol["pools"][ALT_POOL]["ceilings"] = "alt"
    return pol


def effective_limits(key: Key, minute: int | None = None) -> dict[str, float]:
    """Per per-minute limit: what the mesh can have of it (the limit less the outside traffic),
    in the run's ``minute`` (a lowered key's limits from its ``lower_minute`` on)."""
    out = {}
    limits = dict(key.limits)
    if key.lowered and minute is not None and minute >= key.lower_minute:
        limits.update(key.lowered)
    for kind, limit in limits.items():
        if kind in C.MINUTE_KINDS:
            drain = sum(rate for what, rate in key.outside.items() if kind in C.OUTSIDE_DRAINS[what])
            out[kind] = limit - drain
    return out
