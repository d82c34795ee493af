"""Where the Lua scripts live, in a repo checkout and in an installed wheel.

The repo keeps the scripts in the top-level `lua/` folder (with `lua/include/`).
pyproject.toml maps that folder into the wheel as the data-only package
`admission._lua` (so `lua/x.lua` installs as `admission/_lua/x.lua`). An
editable install (`pip install -e .`) runs from the checkout, so there we use
`<repo>/lua` directly.
"""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def lua_dir() -> Path:
    """The folder holding the Lua scripts (and its `include/` subfolder).

    Order: $ADMISSION_LUA_DIR if set; `admission/_lua` (installed wheel);
    `<repo>/lua` next to the package (checkout / editable install).
    """
    env = os.environ.get("ADMISSION_LUA_DIR")
    if env:
        return Path(env).resolve()
    installed = _PKG / "_lua"
    if installed.is_dir():
        return installed
    checkout = _PKG.parent / "lua"
    # pyproject.toml beside it proves it is our repo, not some unrelated
    # top-level `lua` folder in site-packages.
    if checkout.is_dir() and (_PKG.parent / "pyproject.toml").is_file():
        return checkout
    raise FileNotFoundError(
        f"Lua scripts not found: looked in {installed} and {checkout} "
        "(set ADMISSION_LUA_DIR to override)"
    )
