"""admission.tools.sim — the seed's Monte Carlo comparison, on the shipped Lua.

A discrete-event simulator (``engine``) drives the real admission through the public client with
``now`` injected, against a Redis server it starts itself, under the seed's provider model
(``model``) and measured load (``load``), for the policies of ``policies`` and the scenarios of
``scenarios``; ``report`` prints the table, writes the JSON and the plots; ``cli`` is
``admission simulate`` (also ``python -m admission.tools.sim``).
"""
from .runner import Job, run_job, run_jobs

__all__ = ["Job", "run_job", "run_jobs"]
