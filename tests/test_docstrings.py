"""Every public name of ``admission`` and ``admission.integrations`` has a docstring, and so has
every public method of the classes a pod and an operator use: the API reference
(docs/reference/api.md) is built from them, and a name without one would be missing there.

The docstrings are read the way mkdocstrings reads them (griffe, from the source): a constant's
docstring is the string after its assignment."""
from __future__ import annotations

from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

import admission  # noqa: E402
import admission.integrations as integrations  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: The classes whose public methods must all say what they do.
CLASSES = ("Admission", "AsyncAdmission", "Mesh", "AsyncMesh", "Round")
#: Where the names of ``admission.integrations.__all__`` that are not its submodules live (it
#: imports them lazily, so a static reader sees them in their own modules).
LAZY = {"admitted": "admission.integrations.decorator.admitted",
        "use": "admission.integrations._common.use",
        "MovedAway": "admission.integrations._common.MovedAway"}
#: The integration classes on the API page, whose public methods are documented there too.
INTEGRATION_CLASSES = ("admission.integrations.litellm.AdmissionHook",
                       "admission.integrations._httpx_sync.RoundTransport",
                       "admission.integrations._httpx_async.AsyncRoundTransport",
                       "admission.integrations._common.use", "admission.integrations._common.MovedAway")


@pytest.fixture(scope="module")
def package():
    return griffe.load("admission", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)


def _get(package, path: str):
    obj = package[path.removeprefix("admission.")]
    return obj.final_target if obj.is_alias else obj


def _doc(obj) -> str:
    return obj.docstring.value.strip() if obj.docstring else ""


def _path_of(name: str) -> str:
    """The griffe path of a public name: where a class or function is defined, else the name."""
    obj = getattr(admission, name)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and module.startswith("admission") and qualname and callable(obj):
        return f"{module}.{qualname}"
    return f"admission.{name}"


def _public_methods(cls) -> list:
    out = []
    for name, member in cls.all_members.items():
        if name.startswith("_"):
            continue
        target = member.final_target if member.is_alias else member
        if target.is_function or "property" in target.labels:
            out.append((name, target))
    return out


def test_every_public_name_of_admission_has_a_docstring(package):
    missing = [f"admission.{n} ({_path_of(n)})" for n in admission.__all__ if not _doc(_get(package, _path_of(n)))]
    assert not missing, f"public names without a docstring: {', '.join(missing)}"


def test_every_public_name_of_the_integrations_has_a_docstring(package):
    missing = []
    for name in integrations.__all__:
        path = LAZY.get(name, f"admission.integrations.{name}")
        obj = _get(package, path)
        if not _doc(obj):
            missing.append(path)
        if obj.is_module:  # a submodule: its own public functions and classes too
            for member_name, member in obj.members.items():
                if member_name.startswith("_") or member.is_alias:
                    continue
                if (member.is_function or member.is_class) and not _doc(member):
                    missing.append(member.path)
    assert not missing, f"public names without a docstring: {', '.join(missing)}"


@pytest.mark.parametrize("name", CLASSES + INTEGRATION_CLASSES)
def test_every_public_method_has_a_docstring(package, name):
    cls = _get(package, _path_of(name) if "." not in name else name)
    assert cls.is_class
    methods = _public_methods(cls)
    assert methods or name.endswith(("MovedAway", "use"))
    missing = [f"{name}.{m}" for m, target in methods if not _doc(target)]
    assert not missing, f"public methods without a docstring: {', '.join(missing)}"


def test_the_check_finds_a_name_without_one(package, tmp_path):
    # the same reading on a module with one undocumented function and one documented
    (tmp_path / "probe_mod.py").write_text('def said():\n    """Says."""\n\n\ndef silent():\n    pass\n')
    mod = griffe.load("probe_mod", search_paths=[str(tmp_path)])
    assert _doc(mod["said"]) == "Says."
    assert _doc(mod["silent"]) == ""
