"""NeMo 2 / Megatron-Bridge: recipe overrides for a plan ranked for the nemo stack.

Megatron-Bridge's `ConfigContainer` holds a model provider whose fields are Megatron-Core's
`TransformerConfig` names (`model.*`), the training loop (`train.*`), the distributed data-parallel
wrapper (`ddp.*`), the optimizer (`optimizer.*`), the checkpoint (`checkpoint.*`) and the mixed
precision recipe (`mixed_precision`); its recipe scripts take `key=value` overrides of them. ZeRO-3
is Megatron FSDP (`ddp.use_megatron_fsdp`, sharding strategy optim_grads_params, checkpoint format
fsdp_dtensor: Megatron-LM arguments.py:1118-1170), ZeRO-1 the distributed optimizer.
"""

from __future__ import annotations

import shlex
from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch.common import Launch, layout_of, torchrun
from tuner.launch.megatron import cuda_connections_env, transformer_config


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def nemo(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    stack = training.effective_stack
    lay = layout_of(model, training, plan)
    if plan.zero_stage == 2:
        raise ValueError("zero_stage=2: NeMo 2 / Megatron-Bridge has no ZeRO-2 optimizer (Apex's "
                         "DistributedFusedAdam was NeMo 1.x); rank with --emit nemo")
    model_cfg = transformer_config(model, training, plan, lay)
    fsdp = plan.zero_stage == 3
    ddp: dict[str, Any] = {  # Megatron FSDP's default version 1 runs with the distributed optimizer
        "use_distributed_optimizer": plan.zero_stage in (1, 3),
        "overlap_grad_reduce": bool(stack.overlap_grad_reduce),
        "overlap_param_gather": bool(stack.overlap_param_gather and plan.zero_stage >= 1),
        "grad_reduce_in_fp32": not (stack.grad_bytes_bf16 == 2.0 and training.dtype in ("bf16", "fp8")),
    }
    if fsdp:
        ddp.update(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    train = {"micro_batch_size": lay.micro_batch_size, "global_batch_size": lay.global_batch_size}
    # run_recipe.py sets model.seq_length from the dataset's
    dataset = {"seq_length": model.seq_length}
    # Megatron-Bridge's mixed-precision recipes (src/megatron/bridge/training/mixed_precision.py:185-405);
    # fp8 as Megatron-LM's --fp8-format hybrid runs it by default: delayed scaling
    recipes = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed"}
    precision = recipes.get(training.dtype)
    config: dict[str, Any] = {"model": model_cfg, "train": train, "dataset": dataset, "ddp": ddp,
                              "optimizer": {"use_distributed_optimizer": plan.zero_stage in (1, 3)}}
    if fsdp:
        config["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    if precision:
        config["mixed_precision"] = precision
    overrides: list[str] = []
    for section, values in config.items():
        if isinstance(values, dict):
            overrides += [f"{section}.{k}={_value(v)}" for k, v in values.items()
                          if k not in ("bf16", "fp16")]
        else:
            overrides.append(f"{section}={values}")
    if stack.overlap_tp_comm and plan.sequence_parallel:
        overrides.append("comm_overlap.tp_comm_overlap=true")
    order = [a for a in plan.order if a in ("inter", "data")]
    if lay.pp > 1 and lay.dp > 1 and order.index("inter") < order.index("data"):
        overrides.append("dist.use_tp_pp_dp_mapping=true")
    env = cuda_connections_env(lay, fsdp)
    cmd = torchrun(cluster, lay.world, ["scripts/training/run_recipe.py", "--recipe", "RECIPE"])
    # each override one shell word: a layout or a layer list holds |, *, [ and ] (shlex.quote leaves the
    # plain ones as they are)
    text = " \\\n    ".join([" ".join([*env, *cmd]), *(shlex.quote(o) for o in overrides)])
    notes = ("RECIPE: the Megatron-Bridge pretraining recipe of this model family (for example "
             "llama3_70b_pretrain_config); the model.* overrides give the shape gridtune ranked",
             "add your dataset and tokenizer overrides")
    return Launch(kind="nemo", stack=stack.name, text=text, args=tuple(overrides), config=config, notes=notes)
