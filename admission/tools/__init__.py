"""The package's tools, imported only by the CLI commands that use them (and the tests): the demo,
the benchmark, the simulator, the fence's fault-injection report and the local servers they start.
`import admission` never imports this package."""

import json
from typing import Any


def write_json(path: str, doc: Any) -> None:
    """A tool's ``--json FILE``: the result, indented, one trailing newline."""
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
