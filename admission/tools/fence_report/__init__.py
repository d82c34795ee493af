"""The fence's fault-injection report: ``admission fence-report --intents N --seed S``
(also ``python -m admission.tools.fence_report``).

For each fault below it drives N intents (a seeded ``random.Random(seed)``) through the real
scripts and the real client, against a server it starts itself (an embedded redis-server, else
valkey-server, from ``admission.tools.servers``; ``--engine fakeredis|redis|valkey``, or ``--url`` for a
server of your own, where it uses throw-away meshes named ``fence-<fault>``). Every intent is an
``Admission.try_admit(..., borrow="borrowed@q")`` for the primary ``primary@p``, on a caller
clock that moves one second per intent. A seeded share of the intents (``--share``, default
0.5) has the fault injected, the others are healthy baseline intents; ``redis-unreachable``
injects every intent. Around the borrows a sampler writes fresh health samples of both planes,
and a primary pod holds rounds on the primary and spends the primary's retry budget (so the
budget the invariant watches is a live one).

Faults (docs/fence.md says what each one shows):

* ``stale-borrowed-health``: the borrowed plane's sample is absent (the first intent), older
  than health_max_age (its sampler stalled: the clock jumps past the max age), or says the plane
  did not answer;
* ``borrowed-depth``: the borrowed plane at its depth limit, by real waiters on the pool (it is
  filled by another pod first) or by a fresh health sample whose depth says so;
* ``primary-saturation``: the primary at its depth limit (real waiters, or a fresh sample) while
  the borrower is idle and fresh;
* ``late-score``: a borrow admitted for revision R, the intent advanced to R+1, then the late
  score ``bind(seat, R)``; a borrow asked for R after the intent moved to R+1 (a stale-revision
  shed) and its late score; and a late score after a fence shed (the borrowed plane down);
* ``redis-unreachable``: the client pointed at a closed port;
* ``lost-replies``: the reply to an admit, to a retry, or to both is lost after the server
  applied the call (a client wrapper raises ConnectionError after executing it); the intent
  asks again with the same round id, and a lost retry is read back from the intent's record;
* ``pod-killed``: a borrow admitted and retried once, then its pod dies: a pod restarted with
  the same name asks again (same intent) and retries, or another pod asks again, cannot retry
  the dead pod's seat, waits out its lease and is admitted anew and retries.

What is checked, for every intent (the invariant, docs/design.md §8): across every borrow that is
refused or shed, each key of the primary -- ``pool:``, ``lanes:``, ``plane:``, ``pinned:`` and
every lane's ``wait:`` of ``primary@p`` -- is byte-for-byte unchanged (``DUMP`` and ``PTTL`` on a
real server; a structural snapshot on fakeredis, whose DUMP is not Redis' format), and the
primary's retry budget as the census shows it (``retriesLeft``, read at the same caller time) is
unchanged; so is the borrower's. Also: an admitted borrow and everything done with its seat
(retry, bind, advance, release) leave the primary untouched; a retry spends exactly one token of
its own plane; each fault's own expectation (the reason it must give, one decision per intent,
retries spent once, the retry count surviving the pod); and ``doctor`` finds the counts in
agreement with the records after each fault. The exit code is 0 when every check held in every
case, 1 otherwise (the failed checks are printed), 2 on a usage or setup error.

The package, by section: ``planes`` (the two planes, their policy, the invariant's comparison),
``results`` (what a run counts), ``clients`` (the reply-losing client, the compared state),
``harness`` (one fault on one mesh: plumbing and run), ``faults`` (each fault's intents),
``report`` (every fault on a server), ``output`` (the tables), ``cli`` (the command line).
"""
from __future__ import annotations

from ..servers import free_port
from .cli import add_parser, main, run_cli
from .clients import LossyRedis, State
from .faults import FaultRun
from .harness import FaultHarness
from .output import render
from .planes import (BORROWED, DEFAULT_SHARE, FAULT_TEXT, FAULTS, PRIMARY, SHED_REASONS, fence_policy,
                     unchanged)
from .report import run
from .results import Check, FaultResult

__all__ = ["BORROWED", "Check", "DEFAULT_SHARE", "FAULTS", "FAULT_TEXT", "FaultHarness", "FaultResult", "FaultRun",
           "LossyRedis", "PRIMARY", "SHED_REASONS", "State", "add_parser", "fence_policy", "free_port", "main",
           "render", "run", "run_cli", "unchanged"]
