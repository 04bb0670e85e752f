"""DeepSpeed: a config (ds_config.json) and the launcher line, for a plan ranked for the deepspeed or
megatron-deepspeed stack.

Keys as DeepSpeed's `deepspeed/runtime/config.py` reads them (deepspeedai/DeepSpeed edaa7221):
the batch triple (train_batch_size = micro x accumulation x data-parallel size), `zero_optimization`,
precision, activation checkpointing, the `pipeline` section. DeepSpeed's pipeline engine runs 1F1B
only and asserts ZeRO < 2 (deepspeed/runtime/pipe/engine.py:77): the search ranks nothing else for
these stacks. Tensor parallelism: Megatron-DeepSpeed's --tensor-model-parallel-size, or DeepSpeed's
AutoTP (`tensor_parallel.autotp_size`) for plain DeepSpeed.
"""

from __future__ import annotations

import json
from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch.common import Launch, layout_of, nodes


def ds_config(model: Model, training: Training, plan: Plan) -> dict[str, Any]:
    stack = training.effective_stack
    lay = layout_of(model, training, plan, uneven=False)
    config: dict[str, Any] = {
        "train_batch_size": lay.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": lay.num_microbatches,
        "zero_optimization": {"stage": plan.zero_stage, "overlap_comm": bool(stack.overlap_grad_reduce),
                              "contiguous_gradients": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if plan.zero_stage == 3:
        prefetch = 50_000_000 if stack.overlap_param_gather else 0
        config["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch
    if training.dtype in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    elif training.dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if plan.recompute == "full":
        config["activation_checkpointing"] = {"partition_activations": plan.G_intra_r > 1,
                                              "contiguous_memory_optimization": False}
    if lay.pp > 1:
        config["pipeline"] = {"stages": lay.pp, "partition": "uniform"}
    if lay.tp > 1 and stack.name == "deepspeed":
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    return config


def deepspeed(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    stack = training.effective_stack
    lay = layout_of(model, training, plan, uneven=False)
    if lay.pp > 1 and plan.zero_stage > 1:
        raise ValueError(f"zero_stage={plan.zero_stage} with G_inter={lay.pp}: DeepSpeed's pipeline engine "
                         "asserts ZeRO < 2 (deepspeed/runtime/pipe/engine.py:77)")
    if lay.interleaved:
        raise ValueError("interleaved-1f1b: DeepSpeed's pipeline engine runs 1F1B only")
    config = ds_config(model, training, plan)
    notes: list[str] = []
    n, per_node = nodes(cluster, lay.world)
    if stack.name == "megatron-deepspeed":
        args = [f"--tensor-model-parallel-size {lay.tp}", f"--pipeline-model-parallel-size {lay.pp}",
                f"--micro-batch-size {lay.micro_batch_size}", f"--global-batch-size {lay.global_batch_size}",
                f"--num-layers {model.num_layers}", f"--hidden-size {model.hidden_size}",
                f"--num-attention-heads {model.num_attention_heads}", f"--seq-length {model.seq_length}",
                f"--max-position-embeddings {model.seq_length}",
                f"--zero-stage {plan.zero_stage}", "--deepspeed", "--deepspeed_config ds_config.json"]
        if training.dtype in ("bf16", "fp16"):
            args.append(f"--{training.dtype}")
        if plan.recompute == "full":
            args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing"]
        elif plan.recompute == "selective":
            args.append("--recompute-granularity selective")
        if lay.pp == 1:
            args.append("--no-pipeline-parallel")
        cmd = " \\\n    ".join([f"deepspeed --num_nodes {n} --num_gpus {per_node} pretrain_gpt.py", *args])
    else:
        args = []
        cmd = (f"deepspeed --num_nodes {n} --num_gpus {per_node} train.py "
               "--deepspeed --deepspeed_config ds_config.json")
        if lay.pp > 1:
            notes.append(f"build the model as deepspeed.pipe.PipelineModule(layers, num_stages={lay.pp}, "
                         "partition_method='uniform') and train with engine.train_batch()")
        if lay.tp > 1:
            notes.append(f"tensor parallelism {lay.tp}: DeepSpeed AutoTP (tensor_parallel.autotp_size) "
                         "shards the model's Linear layers")
        if plan.recompute != "none":
            notes.append("wrap each transformer block in deepspeed.checkpointing.checkpoint")
    text = json.dumps(config, indent=2) + "\n# launch (ds_config.json above):\n" + cmd
    return Launch(kind="deepspeed", stack=stack.name, text=text, args=(cmd,), config=config,
                  notes=tuple(notes))
