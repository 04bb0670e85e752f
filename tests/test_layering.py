"""perfmodels/, tuner/ and api/ must never import torch: the service starts and answers without it.

Checked two ways: statically (no `import torch` in their sources) and dynamically (importing every
module of those packages in a fresh interpreter leaves `torch` out of sys.modules).
"""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TORCH_FREE = ("perfmodels", "tuner", "api")


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_torch_import_in_sources():
    offenders = []
    for pkg in TORCH_FREE:
        for path in (ROOT / pkg).rglob("*.py"):
            bad = _imports(path) & {"torch", "engine"}
            # tuner/cli handlers may reach the engine lazily (inside functions), never at module level
            if bad and not (path.parts[-2] == "cli" and _only_lazy(path)):
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders


def _only_lazy(path: pathlib.Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] in ("torch", "engine") for m in mods):
                return False
    return True


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
