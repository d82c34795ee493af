"""The package's tools, imported only by the CLI commands that use them (and the tests): the demo,
the benchmark, the simulator, the fence's fault-injection report and the local servers they start.
`import admission` never imports this package."""

import json
from typing import Any


def write_json(path: Any, doc: Any, indent: int = 2, default: Any = None) -> None:
    """A tool's ``--json FILE``: the result, indented, one trailing newline (``default``: json's,
    for what JSON does not know)."""
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=indent, default=default)
        fh.write("\n")
