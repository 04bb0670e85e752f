"""Start-up cost: each entry point imports what it needs and no more (issue 25; docs/architecture.md,
"cli/"). Each check runs the real entry point in a fresh interpreter and reads its `sys.modules`:

- `gridtune --version` / `gridtune --help`: no numpy, scipy, pandas, rich, fastapi, sqlalchemy, torch;
- `gridtune recommend ... --json` (also with `--profile FILE`): no scipy.optimize/scipy.stats,
  pandas, fastapi, sqlalchemy, uvicorn, matplotlib, torch;
- `import tuner` loads no numpy; `tuner.recommend(...)` none of the fitting or service libraries;
- a service search (`api.service.run_recommend`, what a search process runs) imports nothing beyond
  `api.searches.PRELOAD` (what the forkserver imported once) but the standard library.

And the lazy parser is the same parser: `gridtune --help` and every `gridtune COMMAND --help` read
as they do with every command module loaded.

Run: `.venv/bin/python -m pytest tests/test_startup.py -q`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ("perfmodels", "tuner", "api", "engine", "validation")
LIGHT_FORBIDDEN = ("numpy", "scipy", "pandas", "rich", "fastapi", "sqlalchemy", "torch", "pydantic",
                   "uvicorn", "matplotlib")
SEARCH_FORBIDDEN = ("scipy.optimize", "scipy.stats", "pandas", "fastapi", "sqlalchemy", "uvicorn",
                    "matplotlib", "torch", "pyarrow")
SMALL = ["recommend", "--model", "gpt2-small", "--cluster", "selene", "--gpus", "8",
         "--global-batch-size", "64", "--json", "--top", "3"]

_RUN_CLI = """
import json, sys
import cli
try:
    code = cli.main({argv!r})
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\nMODULES " + json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def _fresh(code: str) -> tuple[str, dict]:
    """Run `code` in a fresh interpreter at the repository root; its stdout before the MODULES line,
    and what that line holds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text, _, tail = out.stdout.rpartition("\nMODULES ")
    return text, json.loads(tail)


def _cli(argv: list[str]) -> tuple[str, int, set[str]]:
    text, info = _fresh(_RUN_CLI.format(argv=argv))
    return text, info["code"], set(info["modules"])


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of `names` (packages: any submodule counts) are in `modules`."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_import_no_third_party_library(argv):
    text, code, modules = _cli(argv)
    assert _loaded(modules, LIGHT_FORBIDDEN) == []
    assert _loaded(modules, OURS) == []  # not even the model's nouns
    if argv == ["--version"]:
        assert code == 0 and text.startswith("gridtune ")
    elif argv == ["--help"]:
        assert code == 0 and "recommend" in text and "validate" in text
    else:
        assert code == 2  # a command is required: argparse's usage error, still without the libraries


def test_recommend_json_imports_no_fitting_service_or_plotting_library():
    text, code, modules = _cli(SMALL)
    assert code == 0
    rec = json.loads(text.strip().splitlines()[-1])
    assert rec["best"]["plan"] and rec["launch"]  # the whole answer: ranking, launches, uncertainty
    assert "uncertainty" in rec
    assert _loaded(modules, SEARCH_FORBIDDEN) == []
    assert _loaded(modules, ("rich",)) == []  # --json prints no table and no spinner


def test_recommend_with_a_profile_file_reads_it_without_pandas_or_scipy(tmp_path):
    profile = {"profile_id": "box", "collectives": [], "gemm_tflops_max": 0.188, "gemm_half_size": 64.0,
               "gemm_overhead_us": 20.0, "source": "profile"}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    text, code, modules = _cli(["recommend", "--model", "gpt2-small", "--cluster", "local-cpu", "--gpus", "4",
                                "--global-batch-size", "64", "--profile", str(path), "--json", "--top", "3"])
    assert code == 0 and json.loads(text.strip().splitlines()[-1])["best"]
    assert "tuner.profiles" in modules  # the profile was read
    assert _loaded(modules, SEARCH_FORBIDDEN) == []


def test_import_tuner_is_light_and_its_recommend_needs_only_numpy():
    _, light = _fresh("import json, sys\nimport tuner\nprint('\\nMODULES ' + json.dumps({'modules': "
                      "sorted(sys.modules)}))")
    assert _loaded(set(light["modules"]), ("numpy", "tuner.search", "perfmodels")) == []
    code = textwrap.dedent("""
        import json, sys
        from tuner import recommend
        from perfmodels import Training, presets
        model, cluster = presets.model("gpt2-small"), presets.cluster("selene", 8)
        rec = recommend(model, cluster, Training(global_batch_size=64), top_k=3)
        assert rec.best is not None
        print("\\nMODULES " + json.dumps({"modules": sorted(sys.modules)}))
    """)
    _, info = _fresh(code)
    assert _loaded(set(info["modules"]), (*SEARCH_FORBIDDEN, "rich")) == []


def test_a_service_search_imports_nothing_beyond_what_the_forkserver_preloads():
    code = textwrap.dedent("""
        import importlib, json, sys
        from api import searches, service
        for name in searches.PRELOAD:
            importlib.import_module(name)
        from perfmodels import Training, presets
        from tuner.types import SearchOptions
        job = service.RecommendJob(
            model=presets.model("gpt2-small"), cluster=presets.cluster("selene", 8),
            training=Training(global_batch_size=64), top_k=3, search=SearchOptions(time_budget_s=30.0),
            profile_id=None, time_budget_s=30.0, suggest_trials=2)
        before = set(sys.modules)
        data, complete = service.run_recommend(job)
        assert json.loads(data)["best"] and complete
        new = set(sys.modules) - before
        print("\\nMODULES " + json.dumps({"modules": sorted(
            m for m in new if m.split(".")[0] not in sys.stdlib_module_names)}))
    """)
    _, info = _fresh(code)
    assert info["modules"] == [], "add these to api.searches.PRELOAD: " + ", ".join(info["modules"])


def _help_of(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    return capsys.readouterr().out


def test_the_lazy_parser_reads_as_the_whole_one(capsys, monkeypatch):
    """`gridtune --help` with no command module loaded, and each `gridtune COMMAND --help` with only its
    own, print what the parser with every module prints; COMMANDS' help lines are the modules' own."""
    import cli

    monkeypatch.setenv("COLUMNS", "100")
    full = cli.build_parser()
    assert _help_of(cli.build_parser(load=()), ["--help"], capsys) == _help_of(full, ["--help"], capsys)
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert {a.dest: a.help for a in sub._choices_actions} == cli.COMMANDS
    for name in cli.COMMANDS:
        lazy = cli.build_parser(load={cli.requested_command([name, "--help"])})
        assert _help_of(lazy, [name, "--help"], capsys) == _help_of(full, [name, "--help"], capsys), name


def test_requested_command_is_the_first_word_that_is_not_an_option():
    from cli import requested_command

    assert requested_command(["--version"]) is None
    assert requested_command(["-h", "recommend", "--model", "x"]) == "recommend"
    assert requested_command(["predict", "--plan", "tp=8"]) == "predict"
    assert requested_command([]) is None
