"""The training stack through the REST body and the command line (`training.stack`, `--stack`).

Run: `.venv/bin/python -m pytest -q tests/api/test_stack_input.py`.
"""

from __future__ import annotations

import copy
import json

from api import examples
from cli import main
from perfmodels import Plan, Training, predict, presets


def _body(stack: object) -> dict:
    body = copy.deepcopy(examples.PREDICT)
    body["training"] = {**body["training"], "stack": stack}
    return body


def test_rest_predict_uses_the_named_stack(client):
    """The same layout under two stacks: memory by each stack's bytes, exactly what perfmodels says."""
    got = {}
    for stack in ("megatron-core", "gridtune"):
        r = client.post("/v1/predict", json=_body(stack))
        assert r.status_code == 200, r.text
        got[stack] = r.json()["memory"]["optimizer_gib"]
    model, cluster = presets.model("gpt3-175b"), presets.cluster("selene", 1024)
    plan_fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in examples.PLAN_MEGATRON.items()}
    training = Training(global_batch_size=examples.TRAINING_GPT3["global_batch_size"],
                        dtype=examples.TRAINING_GPT3.get("dtype", "bf16"), stack="megatron-core")
    want = predict(model, cluster, training, Plan(**plan_fields)).memory.optimizer_gib
    assert abs(got["megatron-core"] - want) < 1e-6
    assert got["megatron-core"] != got["gridtune"]  # 12 bytes (master + Adam) vs 8 per parameter


def test_rest_stack_object_overrides_one_option_and_bad_names_are_422(client):
    base = client.post("/v1/predict", json=_body("megatron-core")).json()
    changed = client.post("/v1/predict", json=_body({"name": "megatron-core", "overlap_grad_reduce": False}))
    assert changed.status_code == 200, changed.text
    assert changed.json()["iteration_time_s"] >= base["iteration_time_s"]
    bad = client.post("/v1/predict", json=_body("nemo-99"))
    assert bad.status_code == 422 and "stack" in bad.text and "nemo-99" in bad.text
    bad = client.post("/v1/predict", json=_body({"name": "fsdp", "overlap_everything": True}))
    assert bad.status_code == 422 and "overlap_everything" in bad.text


def test_rest_presets_list_the_stacks(client):
    r = client.get("/v1/presets")
    assert r.status_code == 200
    stacks = r.json()["stacks"]
    assert {"megatron-core", "fsdp", "torchtitan", "gridtune"} <= set(stacks)


def test_cli_recommend_with_a_stack_ranks_only_what_it_runs(capsys):
    assert main(["recommend", "--model", "gpt3-1.7b", "--cluster", "selene", "--gpus", "16",
                 "--global-batch-size", "64", "--stack", "fsdp", "--top", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    plans = [c["plan"] for c in out["candidates"]]
    assert plans and all(
        p["G_intra_r"] == 1 and p["G_inter"] == 1 and p["zero_stage"] in (0, 2, 3) for p in plans
    )
    assert any("fsdp stack does not run" in reason for reason in out["pruned"])


def test_cli_predict_stack_flag_changes_memory(capsys):
    args = [
        "predict",
        "--model",
        "gpt3-1.7b",
        "--cluster",
        "selene",
        "--gpus",
        "8",
        "--global-batch-size",
        "64",
        "--plan",
        "G_data=8,micro_batch_size=1",
        "--json",
    ]
    assert main([*args, "--stack", "megatron-lm"]) == 0
    lm = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*args, "--stack", "gridtune"]) == 0
    ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Megatron: 2 + 4 + 12 bytes per parameter; the engine: 4 + 4 + 8
    lm_mem, our_mem = lm["memory"], ours["memory"]
    assert abs(lm_mem["params_gib"] * 2 - our_mem["params_gib"]) < 1e-9
    assert abs(lm_mem["optimizer_gib"] * 8 / 12 - our_mem["optimizer_gib"]) < 1e-9


def test_search_tries_sequence_parallelism_where_the_stack_has_it():
    """Megatron-Core on 256 H100s for Llama 3 70B: with the ZeRO stages Megatron-LM launches (the
    distributed optimizer; Apex's ZeRO-2 is NeMo 1.x's) the best layout keeps every layer's
    activations (no recomputation) only with sequence parallelism over TP4 (with a pipeline) or TP8:
    within 3% of each other once sequence parallelism carries the same traffic as the all-reduces it
    replaces."""
    import tuner
    from perfmodels import Training, presets

    model, cluster = presets.model("llama3-70b"), presets.cluster("eos", 256)
    best = tuner.recommend(
        model, cluster, Training(global_batch_size=512, stack="megatron-core"), top_k=1
    ).best
    assert best is not None and best.plan.sequence_parallel and best.plan.recompute == "none"
    assert best.plan.G_intra_r in (4, 8) and best.plan.zero_stage == 1
    ours = tuner.recommend(model, cluster, Training(global_batch_size=512, stack="gridtune"), top_k=5)
    assert not any(c.plan.sequence_parallel for c in ours.candidates)  # the engine has none


_LLAMA_ON_GRAND_TETON = ["predict", "--model", "llama3-8b", "--cluster", "grand-teton", "--gpus", "8",
                         "--global-batch-size", "16", "--stack", "torchtitan", "--json"]


def _cli_prediction(capsys, plan: str, *flags: str) -> dict:
    """`gridtune predict --json` for Llama 3 8B on 8 Grand Teton H100s under torchtitan: its prediction."""
    code = main([*_LLAMA_ON_GRAND_TETON, "--plan", plan, *flags])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # flat, as /v1/predict
    assert code == (0 if out["memory"]["fits"] else 1)  # exit 1: the layout does not fit
    return out


def _assert_422_names(client, body: dict, field: str, value: str) -> None:
    body["training"][field] = value
    bad = client.post("/v1/predict", json=body)
    assert bad.status_code == 422 and field in bad.text and value in bad.text


def test_torch_compile_through_rest_and_cli_shrinks_the_loss_memory(client, capsys):
    """`training.torch_compile` (REST) and `--torch-compile` (CLI): compiled blocks run faster, and a
    compiled loss holds 4 bytes per logit where torchtitan's eager one holds 12 (8 x s x b x V bytes
    less on one unpipelined GPU); a bad value names itself."""
    body = copy.deepcopy(examples.PREDICT)
    body["training"] = {**body["training"], "stack": "torchtitan"}
    eager = client.post("/v1/predict", json=body)
    body["training"]["torch_compile"] = "blocks+loss"
    compiled = client.post("/v1/predict", json=body)
    assert eager.status_code == 200 and compiled.status_code == 200, (eager.text, compiled.text)
    # compiled blocks stream fused element-wise bytes: the example's step is faster
    assert compiled.json()["iteration_time_s"] < eager.json()["iteration_time_s"]
    _assert_422_names(client, body, "torch_compile", "inductor")
    plan = "G_data=8,micro_batch_size=2,zero_stage=3"
    cli_eager = _cli_prediction(capsys, plan)["memory"]
    cli_comp = _cli_prediction(capsys, plan, "--torch-compile", "blocks+loss")["memory"]
    model = presets.model("llama3-8b")
    saved = 8192 * 2 * model.vocab_size * (12 - 4) / 2**30
    assert abs(cli_eager["activations_gib"] - cli_comp["activations_gib"] - saved) < 1e-6


def test_flash_kernel_through_rest_and_cli_matches_perfmodels(client, capsys):
    """`training.flash_kernel` / `training.stack.flash_kernel` (REST) and `--flash-kernel` (CLI): a
    pre-Hopper kernel (FlashAttention-2, what SDPA ran on H100 in 2024-25) makes an H100 step slower,
    by exactly what perfmodels predicts; a bad value is a 422 naming field and value."""
    body = copy.deepcopy(examples.PREDICT)
    body["training"] = {**body["training"], "stack": "torchtitan"}
    body["cluster"] = {"preset": "eos", "num_gpus": 1024}  # H100s: on an A100 both kernels are native
    native = client.post("/v1/predict", json=body)
    body["training"]["flash_kernel"] = "pre-hopper"
    fa2 = client.post("/v1/predict", json=body)
    body["training"]["flash_kernel"] = None
    body["training"]["stack"] = {"name": "torchtitan", "flash_kernel": "pre-hopper"}
    fa2_stack = client.post("/v1/predict", json=body)
    for r in (native, fa2, fa2_stack):
        assert r.status_code == 200, r.text
    assert fa2.json()["iteration_time_s"] > native.json()["iteration_time_s"]
    assert fa2_stack.json()["iteration_time_s"] == fa2.json()["iteration_time_s"]
    body["training"]["stack"] = "torchtitan"
    _assert_422_names(client, body, "flash_kernel", "fa3")
    plan = "G_data=8,micro_batch_size=2,zero_stage=3,recompute=selective"
    cli = _cli_prediction(capsys, plan, "--flash-kernel", "pre-hopper")["iteration_time_s"]
    want = predict(presets.model("llama3-8b"), presets.cluster("grand-teton", 8),
                   Training(global_batch_size=16, stack="torchtitan", flash_kernel="pre-hopper"),
                   Plan(G_data=8, micro_batch_size=2, zero_stage=3, recompute="selective"))
    assert abs(cli - want.iteration_time_s) < 1e-9
