"""Puts the checkout's `common/` and `probe_envs/` within reach of a script run from another folder.

Every script imports this module before its own `common` and `probe_envs` imports. In the checkout, those packages
sit beside the script and Python finds them first; nothing changes. A copy kept elsewhere (`cp ppo_fc.py
~/exp/my_ppo.py`) finds this module through `pip install -e .`, whose finder also gives the checkout's `common`,
`benchmark` and `probe_envs` to any program, after everything on `sys.path` (pyproject.toml). Where that finder is
missing (this file installed alone), this module appends the checkout to the end of `sys.path`, so that nothing
already on the path is shadowed. If another project's `common` or `probe_envs` is still found first, the run stops
with one `error:` line naming the file found: a package of another project must not stand in for the checkout's,
silently."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent
PACKAGES = ("common", "probe_envs")


def found_at(name: str) -> Path | None:
    """Where `import name` would find it (or found it): a package's folder, a module's file; None where nothing is."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a module of that name imported without a spec
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package, with or without __init__.py
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin else None


def foreign_packages() -> list[tuple[str, Path | None]]:
    """Each of PACKAGES that Python would not import from the checkout: its name and what it finds instead."""
    return [(name, at) for name in PACKAGES if (at := found_at(name)) != CHECKOUT / name]


def reach_the_checkout() -> None:
    """Append the checkout to `sys.path` where its packages are not found; stop with an `error:` line (status 2)
    where another package of the same name is found first, or where the install holds no checkout."""
    if not foreign_packages():
        return
    if not all((CHECKOUT / name / "__init__.py").is_file() for name in PACKAGES):
        stop(
            f"{Path(__file__).name} was installed without its checkout ({CHECKOUT}): install onefile-rl from the "
            "checkout with `pip install -e .`, or run the script from the checkout"
        )
    sys.path.append(str(CHECKOUT))
    script_folder = Path(sys.path[0] or ".").resolve()
    for name, at in foreign_packages():
        fix = (
            "rename it, or keep the script in another folder"
            if at is not None and at.parent == script_folder
            else f"rename or remove it, or put the checkout before it: PYTHONPATH={CHECKOUT}"
        )
        stop(f"`import {name}` finds {at}, not onefile-rl's {CHECKOUT / name}: {fix}")


def stop(message: str) -> None:
    """One `error:` line on stderr, exit status 2 (common.cli's convention, before common can be imported)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


reach_the_checkout()
