"""A small runtime: `import admission` in a worker pulls in the client and nothing else: not the
tools (demo, benchmark, simulator, fence report, test servers), not their libraries."""
from __future__ import annotations

import json
import subprocess
import sys

TOOLS = ("admission.tools", "admission.serve", "tqdm", "matplotlib", "fakeredis", "prometheus_client", "hypothesis")


def test_import_admission_pulls_in_the_client_and_nothing_else():
    code = ("import sys, json; before = set(sys.modules); import admission; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert "admission.client" in loaded and "admission.aio" in loaded
    assert [m for m in loaded if m.startswith(TOOLS)] == []
    ours = sorted(m for m in loaded if m.startswith("admission"))
    assert ours == sorted({"admission", "admission._log", "admission._mesh_async", "admission._paths", "admission._primitives",
                           "admission._scripts_async", "admission._scripts_sync", "admission.aio", "admission.alternatives",
                           "admission.base", "admission.classify", "admission.client", "admission.codes",
                           "admission.core", "admission.doctor", "admission.errors", "admission.health", "admission.lualib",
                           "admission.ledger", "admission.mesh", "admission.outbox",
                           "admission.policy", "admission.scripts", "admission.urgency", "admission.waiting"}), ours
