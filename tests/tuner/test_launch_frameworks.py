"""The launch gridtune prints runs as printed, for the plan it ranked best (issue 24).

The emitted launches are fed to the frameworks' own code where it runs on a CPU (megatron-core's
TransformerConfig / DistributedDataParallelConfig / RankGenerator, DeepSpeed's DeepSpeedConfig,
torchtitan's config sections parsed by tyro, ParallelDims and pipeline split), and to the table of
Megatron-LM arguments.py rules (bench/framework_checks.py, each rule citing its line). A framework
that is not installed skips its test with the reason (install the `frameworks` extra).

Run: `.venv/bin/python -m pytest -q tests/tuner/test_launch_frameworks.py`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import pytest

from perfmodels import presets
from perfmodels.launchable import stack_problems
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict
from tuner.launch import TARGETS, all_launches, launch_for, launch_problems
from tuner.search import recommend

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import framework_checks as fc

CASES = [  # (model, cluster, gpus, global batch): small and large, dense MHA and GQA, even and uneven layers
    ("gpt3-175b", "selene", 64, 256),
    ("llama3-70b", "eos", 256, 512),
    ("llama3-405b", "eos", 1024, 1024),
    ("llama3-8b", "eos", 16, 64),
    ("gpt2-xl", "selene", 8, 64),
]


def _need(kind: str) -> None:
    reason = fc.missing(kind)
    if reason:
        pytest.skip(reason)


def _best(model_name: str, cluster_name: str, gpus: int, gb: int, stack: str, **training: object):
    model, cluster = presets.model(model_name), presets.cluster(cluster_name, gpus)
    tr = Training(global_batch_size=gb, stack=stack, **training)
    rec = recommend(model, cluster, tr, top_k=3)
    assert rec.best is not None, (model_name, gpus, stack)
    return model, cluster, tr, rec


def _best_launch_checked(kind: str, case: tuple):
    """The best plan of `case` on `kind`'s default stack, launched: the launch passes the framework's
    own checks, and the plan fits and predicts what the search ranked. (model, plan, launch)."""
    _need(kind)
    model, cluster, tr, rec = _best(*case, stack=TARGETS[kind].default_stack)
    plan = rec.best.plan
    assert launch_problems(kind, model, cluster, tr, plan) == []
    launch = launch_for(kind, model, cluster, tr, plan)
    assert fc.check(kind, launch, model, cluster, tr, plan) == []
    pred = predict(model, cluster, tr, plan)
    assert pred.memory.per_gpu_gib <= cluster.gpu.memory_gib
    assert abs(pred.iteration_time_s - rec.best.prediction.iteration_time_s) < 1e-6 * pred.iteration_time_s
    return model, plan, launch


@pytest.mark.parametrize("kind", list(TARGETS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] + f"-{c[2]}" for c in CASES])
def test_every_emitter_passes_its_framework_for_the_best_plan(kind, case):
    _best_launch_checked(kind, case)


def test_the_megatron_checks_fail_on_a_broken_launch():
    _need("megatron")
    model, cluster, tr = presets.model("llama3-405b"), presets.cluster("eos", 64), Training(
        global_batch_size=64, stack="megatron-core")
    plan = Plan(G_data=2, G_inter=4, G_intra_r=8, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    launch = launch_for("megatron", model, cluster, tr, plan)
    assert "--decoder-first-pipeline-num-layers 31" in launch.text  # 126 layers: 31 + 32 + 32 + 31
    assert fc.check("megatron", launch, model, cluster, tr, plan) == []
    broken = dataclasses.replace(launch, args=tuple(a for a in launch.args if "pipeline-num-layers" not in a))
    assert any(p.startswith("arguments.py:997") for p in fc.megatron_arg_problems(broken, 64))
    cfg = dict(launch.config["transformer_config"], num_layers_in_first_pipeline_stage=30)
    assert fc.transformer_config_problems(cfg)  # 30 + 2*32 + 31 != 126: megatron-core refuses
    # TP 16 over 8 key/value groups: refused by the search, the rule table and the launcher rules
    tp16 = Plan(G_data=1, G_inter=4, G_intra_r=16, micro_batch_size=1, zero_stage=0)
    assert any("num_query_groups=8" in p for p in stack_problems(model, tr, tp16))
    tp16_args = tuple(a.replace("--tensor-model-parallel-size 8", "--tensor-model-parallel-size 16")
                      for a in launch.args)
    args = dataclasses.replace(launch, args=tp16_args)
    assert any("attention.py:169" in p for p in fc.megatron_arg_problems(args, 64))


def test_deepspeed_pipelines_allow_zero_1_at_most():
    _need("deepspeed")
    model, cluster = presets.model("gpt3-7.5b"), presets.cluster("selene", 16)
    tr = Training(global_batch_size=64, stack="deepspeed")
    rec = recommend(model, cluster, tr, top_k=50)
    assert all(c.plan.zero_stage <= 1 for c in rec.candidates if c.plan.G_inter > 1)
    assert all(c.plan.G_intra_r == 1 for c in rec.candidates if c.plan.G_inter > 1)  # AutoTP or a pipeline
    assert any("ZeRO" in reason and "deepspeed" in reason for reason in rec.pruned)
    piped = Plan(G_data=4, G_inter=4, micro_batch_size=1, zero_stage=2,
                 placement=("col", "row", "depth", "data", "inter"))  # DeepSpeed's pipe-outermost order
    with pytest.raises(ValueError, match="allows ZeRO <= 1"):
        launch_for("deepspeed", model, cluster, tr, piped)
    ok = launch_for("deepspeed", model, cluster, tr, dataclasses.replace(piped, zero_stage=1))
    assert fc.check("deepspeed", ok, model, cluster, tr, dataclasses.replace(piped, zero_stage=1)) == []
    bad = dataclasses.replace(ok, config={**ok.config, "zero_optimization": {"stage": 2}})
    assert any("pipe/engine.py:77" in p for p in fc.check_deepspeed(bad, 4))
    wrong_batch = dataclasses.replace(ok, config={**ok.config, "gradient_accumulation_steps": 3})
    assert any("DeepSpeedConfig" in p for p in fc.check_deepspeed(wrong_batch, 4))


def test_torchtitan_checks_the_parallel_dims_and_the_stage_split():
    _need("torchtitan")
    model, cluster = presets.model("llama3-70b"), presets.cluster("eos", 64)
    tr = Training(global_batch_size=64, stack="torchtitan")
    plan = Plan(G_data=2, G_inter=4, G_intra_r=8, micro_batch_size=1, schedule="interleaved-1f1b",
                virtual_stages=2, zero_stage=3, sequence_parallel=True,
                placement=("col", "row", "depth", "data", "inter"))
    launch = launch_for("torchtitan", model, cluster, tr, plan)
    assert "--parallelism.pipeline_parallel_schedule Interleaved1F1B" in launch.text
    assert fc.check("torchtitan", launch, model, cluster, tr, plan) == []
    assert any("ParallelDims" in p for p in fc.check_torchtitan(launch, 32, model.num_layers))
    bad = dataclasses.replace(launch, args=tuple(a.replace("layers_per_stage 10", "layers_per_stage 9")
                                                 for a in launch.args))
    assert fc.check_torchtitan(bad, 64, model.num_layers)
    # 80 layers over 4 x 6 chunks: ceil(80/24) = 4 layers a stage makes 20 stages, not 24
    with pytest.raises(ValueError, match="does not split"):
        launch_for("torchtitan", model, cluster, tr, dataclasses.replace(plan, virtual_stages=6))


def test_nemo_zero3_is_megatron_fsdp_and_fp8():
    _need("nemo")
    model, cluster, tr, rec = _best("llama3-70b", "eos", 64, 128, "nemo", dtype="fp8")
    launches = all_launches(model, cluster, tr, rec.best.plan)
    assert set(launches) == {"nemo", "megatron"}  # both launch what the nemo preset ranks
    text = launches["nemo"]["text"]
    if rec.best.plan.zero_stage == 3:
        assert "ddp.use_megatron_fsdp=true" in text and "checkpoint.ckpt_format=fsdp_dtensor" in text
        assert "--use-megatron-fsdp" in launches["megatron"]["text"]
    assert "mixed_precision=bf16_with_fp8_delayed_scaling_mixed" in text
    assert "--fp8-format hybrid" in launches["megatron"]["text"]
    plan = Plan(G_data=16, G_intra_r=4, micro_batch_size=1, zero_stage=3, sequence_parallel=True)
    launch = launch_for("nemo", model, cluster, tr, plan)
    assert fc.check("nemo", launch, model, cluster, tr, plan) == []
    broken = dataclasses.replace(launch, config={**launch.config, "checkpoint": {}})
    assert any("fsdp_dtensor" in p for p in fc.check_nemo(broken, 64))


def test_megatron_core_ranks_only_what_pretrain_gpt_launches():
    """Issue 24, case 1: the best megatron-core plan was ZeRO-2, which Megatron-LM has not."""
    model, cluster, tr, rec = _best("llama3-70b", "eos", 256, 512, "megatron-core")
    assert all(c.plan.zero_stage in (0, 1) for c in rec.candidates)
    launch = launch_for("megatron", model, cluster, tr, rec.best.plan)
    assert ("--use-distributed-optimizer" in launch.args) == (rec.best.plan.zero_stage == 1)
    with pytest.raises(ValueError, match="offers ZeRO stages"):
        launch_for("megatron", model, cluster, tr, dataclasses.replace(rec.best.plan, zero_stage=2))


def test_the_cli_prints_the_plan_it_ranked(capsys):
    from cli import main

    argv = ["recommend", "--model", "llama3-8b", "--cluster", "eos", "--gpus", "64", "--global-batch-size",
            "128", "--emit", "megatron", "--top", "3"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    rec = json.loads(captured.out)
    assert "ranking layouts the megatron-core stack can launch" in captured.err
    best = rec["best"]["plan"]
    assert set(rec["launch"]) == {"megatron", "nemo"}
    text = rec["launch"]["megatron"]["text"]
    assert f"--tensor-model-parallel-size {best['G_intra_r']}" in text
    assert f"--pipeline-model-parallel-size {best['G_inter']}" in text
    assert main(argv) == 0
    assert text in capsys.readouterr().out  # the same text as --json carries
    assert main([*argv, "--stack", "fsdp"]) != 0
    err = capsys.readouterr().err
    assert "--emit megatron launches the megatron-core or megatron-lm or nemo stack" in err


def test_torchrun_is_the_gridtune_emitter(capsys):
    from cli import main

    assert main(["recommend", "--model", "tiny-gpt", "--cluster", "local-cpu", "--gpus", "4",
                 "--global-batch-size", "8", "--dtype", "fp32", "--emit", "torchrun", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert set(rec["launch"]) == {"gridtune"}
    assert rec["launch"]["gridtune"]["config"]["plan"] == rec["best"]["plan"]


def test_the_rest_answer_carries_the_text_the_cli_prints(tmp_path, capsys):
    from fastapi.testclient import TestClient

    from api import create_app
    from api.settings import Settings
    from cli import main

    body = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "eos", "num_gpus": 64},
            "training": {"global_batch_size": 128, "stack": "megatron-core"}, "top_k": 3}
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", api_key=None,
                        max_search_time_s=30.0, default_search_time_s=30.0)
    with TestClient(create_app(settings)) as client:
        rec = client.post("/v1/recommend", json=body).json()
    assert set(rec["launch"]) == {"megatron", "nemo"}
    assert rec["launch"]["megatron"]["stack"] == "megatron-core"
    argv = ["recommend", "--model", "llama3-8b", "--cluster", "eos", "--gpus", "64",
            "--global-batch-size", "128", "--stack", "megatron-core", "--emit", "megatron", "--top", "3"]
    assert main(argv) == 0
    assert rec["launch"]["megatron"]["text"] in capsys.readouterr().out


MOE_CASES = [  # (model, cluster, gpus, global batch): a few and many experts, shared experts
    ("mixtral-8x7b", "eos", 64, 256),
    ("qwen3-30b-a3b", "eos", 32, 512),
    ("deepseek-v3", "eos", 1024, 8192),
]


@pytest.mark.parametrize("kind", ["megatron", "nemo"])
@pytest.mark.parametrize("case", MOE_CASES, ids=[c[0] for c in MOE_CASES])
def test_the_best_mixture_of_experts_plan_launches_as_ranked(kind, case):
    """The best MoE plan's launch passes megatron-core's own checks (TransformerConfig with the MoE
    fields, the expert layers' RankGenerator) and carries the expert layout it was ranked with (bf16:
    TransformerConfig's FP8 checks need Transformer Engine, which a CPU test machine lacks)."""
    model, plan, launch = _best_launch_checked(kind, case)
    if kind == "megatron":
        text = launch.text
        assert f"--num-experts {model.num_moe_experts}" in text
        assert f"--moe-router-topk {model.moe_router_topk}" in text
        if plan.G_ep > 1:
            assert f"--expert-model-parallel-size {plan.G_ep}" in text, text


@pytest.mark.parametrize("kind", ["megatron", "nemo"])
def test_the_published_deepseek_v3_layout_launches_with_its_expert_arguments(kind):
    """NVIDIA's DeepSeek-V3 layout on 1,024 H100s (TP2 PP8 VP4 EP64, Megatron-Bridge 25.09): 61 layers
    over 8 x 4 chunks take a custom pipeline layout; megatron-core accepts the launch, which names the
    experts and their layout, and the printed command keeps the layout and the layer list one shell
    word each (a pipe or a bracket unquoted would break it as pasted)."""
    import shlex

    _need(kind)
    model, cluster = presets.model("deepseek-v3"), presets.cluster("eos", 1024)
    tr = Training(global_batch_size=8192, stack=TARGETS[kind].default_stack)
    plan = Plan(G_data=64, G_inter=8, G_intra_r=2, G_ep=64, G_etp=1, micro_batch_size=1,
                schedule="interleaved-1f1b", virtual_stages=4, recompute="selective", sequence_parallel=True,
                zero_stage=1, placement=("col", "row", "cp", "depth", "data", "inter"))
    assert launch_problems(kind, model, cluster, tr, plan) == []
    launch = launch_for(kind, model, cluster, tr, plan)
    assert fc.check(kind, launch, model, cluster, tr, plan) == []
    words = shlex.split(launch.text.replace("\\\n", " "))
    layout = "Et|" + "t*2|" * 29 + "t|tL"
    if kind == "megatron":
        assert words[words.index("--pipeline-model-parallel-layout") + 1] == layout
        assert words[words.index("--moe-layer-freq") + 1].startswith("[0,0,0,1,")
        for flag in ("--num-experts 256", "--moe-router-topk 8", "--moe-ffn-hidden-size 2048",
                     "--expert-model-parallel-size 64", "--expert-tensor-parallel-size 1",
                     "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 8"):
            assert flag in launch.text, (flag, launch.text)
    else:
        assert f"model.pipeline_model_parallel_layout={layout}" in words
        assert "model.expert_model_parallel_size=64" in words and "model.num_moe_experts=256" in words
        assert all(o in words for o in launch.args)
