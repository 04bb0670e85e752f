"""torchtitan: the `torchtitan.train` command with its config overrides, for a plan ranked for the
torchtitan stack.

torchtitan (pytorch/torchtitan b5bcd76c; the 0.3 release) takes `--module MODEL --config RECIPE` and
overrides `--section.key value` of its `Trainer.Config` (parsed by tyro; older releases read the same
keys from a TOML `--job.config_file`, printed under `config`). The layout: `parallelism.*`
(data_parallel_replicate_degree x data_parallel_shard_degree x context x tensor x pipeline = world,
torchtitan/distributed/parallel_dims.py:182), FSDP's reshard policy for ZeRO-2 ("never") or ZeRO-3
("always"), pipeline stages of `pipeline_parallel_layers_per_stage` layers (no first/last weights,
so the stage count is ceil(L / layers_per_stage), pipeline_parallel.py:223), the activation
checkpointing subcommand, compile and float8.
"""

from __future__ import annotations

from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch.common import Launch, layout_of, torchrun

_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def titan_config(model: Model, training: Training, plan: Plan) -> dict[str, dict[str, Any]]:
    """The overrides as {section: {key: value}} (the TOML of older releases has the same shape)."""
    stack = training.effective_stack
    lay = layout_of(model, training, plan, uneven=False)
    zero = plan.zero_stage
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": lay.dp if zero == 0 else 1,
        "data_parallel_shard_degree": 1 if zero == 0 else lay.dp,
        "tensor_parallel_degree": lay.tp,
        "enable_sequence_parallel": bool(plan.sequence_parallel),
        "context_parallel_degree": lay.cp,
        "expert_parallel_degree": lay.ep,
        "pipeline_parallel_degree": lay.pp,
        "fsdp_reshard_after_forward": "always" if zero == 3 else "never",
    }
    train: dict[str, Any] = {"global_batch_size": lay.global_batch_size, "seq_len": model.seq_length,
                             "mixed_precision_param": "float32" if training.dtype == "fp32" else "bfloat16"}
    if lay.pp > 1:
        schedule = ("interleaved-1f1b" if lay.interleaved
                    else "gpipe" if plan.schedule == "gpipe" else "1f1b")
        chunks = lay.pp * lay.vpp
        par.update(pipeline_parallel_schedule=_SCHEDULES[schedule],
                   pipeline_parallel_microbatch_size=lay.micro_batch_size,
                   pipeline_parallel_layers_per_stage=-(-model.num_layers // chunks),
                   pipeline_parallel_first_stage_less_layers=0,
                   pipeline_parallel_last_stage_less_layers=0)
        train["local_batch_size"] = lay.global_batch_size // lay.dp  # micro-batches come from the schedule
    else:
        train["local_batch_size"] = lay.micro_batch_size  # accumulation: global / (local x dp) steps
    config: dict[str, dict[str, Any]] = {"parallelism": par, "training": train}
    if stack.torch_compile != "none":
        config["compile"] = {"enable": True,
                             "components": ["model", "loss"] if stack.torch_compile == "blocks+loss"
                             else ["model"]}
    return config


def torchtitan(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    lay = layout_of(model, training, plan, uneven=False)
    config = titan_config(model, training, plan)
    overrides: list[str] = []
    for section, values in config.items():
        for key, value in values.items():
            if isinstance(value, bool):  # tyro's flag pair: --section.key / --section.no_key
                overrides.append(f"--{section}.{key}" if value else f"--{section}.no_{key}")
            elif isinstance(value, list):
                overrides.append(f"--{section}.{key} " + " ".join(str(v) for v in value))
            else:
                overrides.append(f"--{section}.{key} {value}")
    ac = {"none": "none", "full": "full", "selective": "selective"}[plan.recompute]
    overrides.append(f"activation_checkpoint:{ac}")  # a tyro subcommand: after the other overrides
    notes = ["MODEL/RECIPE: the torchtitan model module and config_registry recipe with this model's shape "
             "(for example --module llama3 --config llama3_70b)"]
    if training.dtype == "fp8":
        notes.append("fp8: use the model's float8 recipe (its config_registry's *_float8 entry or "
                     "model.converters float8)")
    cmd = torchrun(cluster, lay.world, ["-m", "torchtitan.train", "--module", "MODEL", "--config", "RECIPE"])
    text = " \\\n    ".join([" ".join(cmd), *overrides])
    return Launch(kind="torchtitan", stack=training.effective_stack.name, text=text, args=tuple(overrides),
                  config={**config, "activation_checkpoint": ac, "vpp": lay.vpp}, notes=tuple(notes))
