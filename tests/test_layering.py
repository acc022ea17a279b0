"""The package's architecture, checked from its source: imports only run downward (the library
never imports the driver, kernels and baselines never import the API, the registry or the driver;
the rungs' host launch path imports only what is below it, and their device code not even that),
there is no import cycle, and the vocabulary shared by every layer (B layouts) has one definition."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from gluon_survey import api
from gluon_survey.launch import B_LAYOUTS, b_layout, is_kmajor

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gluon_survey"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Modules of the package that `path` imports anywhere (module level or inside functions).
    `from X import y` counts X.y when y is a module of the package, else X."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


GRAPH = _graph()


def test_the_graph_sees_the_package():
    assert {"gluon_survey.api", "gluon_survey.kernels.warpspec", "gluon_survey.driver.cli"} <= GRAPH.keys()
    assert "gluon_survey.registry" in GRAPH["gluon_survey.api"]
    rung = GRAPH["gluon_survey.kernels.persistent"]
    assert {"gluon_survey.kernels.common", "gluon_survey.kernels.plan"} <= rung


@pytest.mark.parametrize("layer", ["gluon_survey.kernels", "gluon_survey.baselines"])
def test_kernels_and_baselines_import_neither_the_api_nor_the_driver(layer):
    above = ("gluon_survey.api", "gluon_survey.registry", "gluon_survey.driver")
    for module, imports in GRAPH.items():
        if module.startswith(layer):
            bad = sorted(m for m in imports if m.startswith(above))
            assert not bad, f"{module} imports {bad}: capability and SM count are passed in (launch.Target)"


def test_the_library_does_not_import_the_driver():
    for module, imports in GRAPH.items():
        if not module.startswith("gluon_survey.driver") and module != "gluon_survey.__main__":
            bad = sorted(m for m in imports if m.startswith("gluon_survey.driver"))
            assert not bad, f"{module} imports {bad}"


def test_leaf_modules_import_nothing_of_the_package():
    assert GRAPH["gluon_survey.launch"] == set()
    assert GRAPH["gluon_survey.compat"] == set()


def test_the_launch_path_imports_only_what_is_below_it():
    """kernels/plan.py (descriptors, Launcher, Plan, Rung) builds on the device code and the leaves:
    no rung, no API, registry, auto mode or driver."""
    below = {"gluon_survey.launch", "gluon_survey.compat", "gluon_survey.kernels.common"}
    assert GRAPH["gluon_survey.kernels.plan"] <= below, sorted(GRAPH["gluon_survey.kernels.plan"] - below)


def _external_imports(module: str) -> set[str]:
    """Top-level names of the packages outside gluon_survey that `module` imports anywhere."""
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found - {"gluon_survey"}


def test_the_device_code_stays_device_code():
    """kernels/common.py (GemmConfig, Ring, the shared @gluon.jit functions) imports neither the host
    launch path nor torch: of the package, only the triton-release shims."""
    assert GRAPH["gluon_survey.kernels.common"] == {"gluon_survey.compat"}
    assert "torch" not in _external_imports("gluon_survey.kernels.common")
    assert "torch" in _external_imports("gluon_survey.kernels.plan")  # the helper sees imports


def test_no_import_cycle():
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = " -> ".join(path[path.index(module) :] + (module,))
            pytest.fail(f"import cycle: {cycle}")
        if module in done:
            return
        for dep in GRAPH[module]:
            visit(dep, (*path, module))
        done.add(module)

    for module in GRAPH:
        visit(module, ())


def test_importing_a_kernel_module_changes_no_other_module():
    """Importing the Blackwell modules last leaves the Hopper rungs' configs as they were."""
    import importlib

    from gluon_survey.kernels import blocked, persistent, pipelined

    before = {m.__name__: dict(m.CONFIGS) for m in (blocked, pipelined, persistent)}
    for name in ("blackwell", "warpspec_tcgen05", "warpspec", "arch"):
        importlib.reload(importlib.import_module(f"gluon_survey.kernels.{name}"))
    assert {m.__name__: dict(m.CONFIGS) for m in (blocked, pipelined, persistent)} == before


# --------------------------------------------------------------------------------------------------
# One B-layout vocabulary, decided by one function.


def _f16(*shape: int) -> torch.Tensor:
    return torch.randn(shape).half()


@pytest.mark.parametrize(
    ("b", "layout"),
    [
        (_f16(64, 32), "row"),  # row-major [K, N]
        (_f16(32, 64).T, "t"),  # transpose view of a contiguous [N, K] weight
        (_f16(64, 48)[:, :40], "row"),  # row-major with a padded row stride
        (_f16(40, 72)[:, :64].T, "t"),  # weight with a padded row stride
        (_f16(64, 1), "row"),  # contiguous column: unit inner stride
        (_f16(1, 64).T, "t"),  # N == 1 transpose view of a [1, K] weight
        (_f16(1, 64), "row"),  # K == 1 row
        (_f16(64, 64)[::2, ::2], "row"),  # neither: described row-major after an aligned copy
    ],
    ids=["row", "t", "row-padded", "t-padded", "column", "t-N1", "row-K1", "strided"],
)
def test_b_layout_and_the_aligned_operand_tma_describes(b, layout):
    assert b_layout(b) == layout and layout in B_LAYOUTS
    aligned, copied = api._aligned_b(b)
    assert b_layout(aligned) == layout
    described = aligned.t() if is_kmajor(layout) else aligned
    assert api._tma_ok(described), (described.shape, described.stride())
    torch.testing.assert_close(aligned, b, rtol=0, atol=0)
    assert copied == (not api._tma_ok(b.t() if layout == "t" else b))


def test_unknown_layout_is_an_error():
    with pytest.raises(ValueError, match="row, t"):
        is_kmajor("nk")
