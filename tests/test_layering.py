"""The package layers, enforced: no upward import, no exceptions (docs/architecture.md, "Packages").

    cli/ ──> api/, engine/, tuner/, validation/, perfmodels/   (the composition root)
    api/ ──> tuner/ ──> perfmodels/
    engine/ ──> tuner/, perfmodels/
    validation/ ──> perfmodels/

`perfmodels`, `tuner`, `api` and `validation` never import torch, so the service starts and answers
without it. Checked two ways: statically (every import statement in the sources, at module level or
inside a function) and dynamically (importing every module of the torch-free packages in a fresh
interpreter leaves `torch` out of sys.modules).

Run: `.venv/bin/python -m pytest tests/test_layering.py`.
"""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = {"perfmodels", "tuner", "api", "engine", "validation", "cli"}

# package -> the packages of ours (besides itself) it may import; anything else of ours is upward.
ALLOWED = {
    "perfmodels": set(),
    "validation": {"perfmodels"},
    "tuner": {"perfmodels"},
    "api": {"tuner", "perfmodels"},
    "engine": {"tuner", "perfmodels"},
}
TORCH_FREE = ("perfmodels", "tuner", "api", "validation")


def _imports(path: pathlib.Path) -> set[str]:
    """Top-level names of every absolute import in the file, lazy ones (inside functions) included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_upward_import():
    offenders = []
    for pkg, allowed in ALLOWED.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            upward = (_imports(path) & OURS) - allowed - {pkg}
            if upward:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(upward)}")
    assert not offenders, offenders


def test_no_torch_import_in_torch_free_sources():
    offenders = [
        str(path.relative_to(ROOT))
        for pkg in TORCH_FREE
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if "torch" in _imports(path)
    ]
    assert not offenders, offenders


def test_importing_torch_free_packages_does_not_load_torch():
    code = (
        "import importlib, pkgutil, sys\n"
        f"for pkg in {TORCH_FREE!r}:\n"
        "    mod = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
