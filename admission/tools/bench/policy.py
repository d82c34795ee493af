"""The bench's policy, its measured lane and pool, and the targets it prints next to the figures."""
from __future__ import annotations

from typing import Any


MESH = "bench"
PROVIDER = "bench"
POOL = f"sonnet@{PROVIDER}"
MEASURED_LANE = "reviews"
#: The estimate every case runs at: far above any seats + waiters, so every fill is admitted
#: within its lane's floor and the measured admit takes the same path in every case.
BIG_ESTIMATE = 200_000
#: Day-long leases: nothing expires (and nothing is swept) while a case runs.
LEASE_TTL = 86_400

#: Targets printed next to the figures (µs; the 32-lane admit has its own).
TARGET_EXTRA = 40.0  # admit and release p50 over PING p50, same loop
TARGET_EXTRA_MANY_LANES = 55.0  # admit over PING with 32 lanes or more
TARGET_SERVER = 30.0  # the server's µs per admit
TARGET_SERVER_MANY_LANES = 45.0
MANY_LANES = 32
TARGET_FLAT_RATIO = 1.25

#: The seed's lanes (deploy/policy.example.toml), the measured lane first.
SEED_LANES: list[tuple[str, float, float, int]] = [
    ("reviews", 0.30, 2, 40),
    ("express", 0.10, 4, 70),
    ("watchdog", 0.05, 2, 60),
    ("babysitter", 0.05, 2, 50),
    ("bugfix", 0.25, 1, 30),
    ("triage", 0.10, 1, 20),
    ("embeddings", 0.05, 1, 10),
]

DEFAULT = dict(lanes=[1, 7, 32], seats=[10, 1_000, 10_000], waiters=[0, 1_000], iterations=2_000, pods=8)
QUICK = dict(lanes=[1, 7], seats=[10, 1_000], waiters=[0, 100], iterations=300, pods=8)
#: Calls of each kind in the blocks that measure the server's time per call.
SERVER_BLOCK = 1_000
#: Seconds of the multi-pod run (decisions per second).
PODS_SECONDS = 5.0
CENSUS_DEFAULT = dict(lanes=[8], estimates=[10, 1_000, 50_000], iterations=1_000)
PIPELINE_CHUNK = 1_000
#: With waiters, newcomers are queued this many at a time (untimed, outside the server figures).
REFILL = 100


def lanes_table(n: int) -> dict[str, dict[str, Any]]:
    """``n`` lanes: the seed's (measured lane first), then ``batch-NN`` lanes sharing the floor
    left; floors always sum to <= 1."""
    if n < 1:
        raise ValueError("a policy needs at least one lane")
    seed = SEED_LANES[:n]
    extra = n - len(seed)
    left = max(0.0, 1.0 - sum(f for _, f, _, _ in seed))
    table = {name: {"floor": floor, "weight": weight, "priority": prio} for name, floor, weight, prio in seed}
    for i in range(extra):
        table[f"batch-{i + 1:02d}"] = {"floor": round(left / extra, 9) if extra else 0.0,
                                      "weight": 1, "priority": -(i + 1)}
    return table


#: ``--ceilings``: the pool's scope has all six rate ceilings, too large to ever refuse, so each
#: admit checks and debits six buckets and each release reconciles them
BENCH_CEILINGS = {"rpm": 1e11, "tpm": 1e11, "itpm": 1e11, "otpm": 1e11, "rpd": 1e11, "tpd": 1e11}
#: what a ``--ceilings`` admit declares and its release reports (tokens)
BENCH_CALL = {"input_tokens": 2_000, "max_tokens": 1_024}


def bench_policy(n_lanes: int, seed_estimate: float, ceilings: bool = False) -> dict[str, Any]:
    pol: dict[str, Any] = {
        "tunables": {"seed_estimate": seed_estimate, "max_estimate": BIG_ESTIMATE,
                     "lease_ttl": LEASE_TTL, "grow_interval": LEASE_TTL},
        "lanes": lanes_table(n_lanes),
        "providers": {PROVIDER: {}},
        "pools": {POOL: {}},
    }
    if ceilings:
        pol["ceilings"] = {"bench": dict(BENCH_CEILINGS)}
        pol["pools"][POOL]["ceilings"] = "bench"
    return pol


def extra_target(lanes: int) -> float:
    return TARGET_EXTRA_MANY_LANES if lanes >= MANY_LANES else TARGET_EXTRA


def server_target(lanes: int) -> float:
    return TARGET_SERVER_MANY_LANES if lanes >= MANY_LANES else TARGET_SERVER
