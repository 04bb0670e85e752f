"""The chosen plan as something to launch: Megatron-LM/NeMo arguments, a DeepSpeed config, or the
gridtune engine's torchrun line and `engine.init(...)` call.

Why: a ranking is only useful once it runs. `gridtune recommend --emit megatron|deepspeed|torchrun`
prints one of these for the best plan, and `POST /v1/recommend` carries all three under `launch`.
Where a stack cannot express part of the plan (Megatron has no 2D/3D tensor parallelism, DeepSpeed's
pipeline is set in code), the launch says so in `notes` instead of silently dropping it.

    from tuner.launch import launch_for
    spec = launch_for("megatron", model, cluster, training, rec.best.plan)
    print(spec.text)
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training

KINDS = ("megatron", "deepspeed", "torchrun")


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One way to run a plan: `text` to paste (a command line, a JSON config, Python), and `notes` on
    what the target cannot express or what the user must still set."""

    kind: str
    text: str
    args: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "args": list(self.args), "config": self.config,
                "notes": list(self.notes)}


def _nodes(cluster: Cluster, plan: Plan) -> tuple[int, int]:
    world = plan.G_data * plan.G_inter * plan.G_intra_d * plan.G_intra_r * plan.G_intra_c
    per_node = min(cluster.gpus_per_node, world)
    return max(1, math.ceil(world / per_node)), per_node


def _torchrun(cluster: Cluster, plan: Plan, script: str) -> list[str]:
    nnodes, per_node = _nodes(cluster, plan)
    cmd = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={per_node}"]
    if nnodes > 1:
        cmd += ["--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:29500"]
    return [*cmd, script]


def _microbatches(training: Training, plan: Plan) -> int:
    return training.global_batch_size // (plan.G_data * plan.G_intra_d * plan.micro_batch_size)


def megatron(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """Megatron-LM / NeMo (Megatron-Core) `pretrain_gpt.py` arguments."""
    notes: list[str] = []
    if plan.G_intra_c > 1 or plan.G_intra_d > 1:
        notes.append(
            f"G_intra_c={plan.G_intra_c}, G_intra_d={plan.G_intra_d}: Megatron has 1D tensor parallelism "
            "only "
            "(G_intra_r); run this plan with the gridtune engine (--emit torchrun), or search again with "
            "--pin G_intra_c=1 --pin G_intra_d=1"
        )
    args = [
        f"--tensor-model-parallel-size {plan.G_intra_r}",
        f"--pipeline-model-parallel-size {plan.G_inter}",
        f"--micro-batch-size {plan.micro_batch_size}",
        f"--global-batch-size {training.global_batch_size}",
    ]
    if plan.G_inter > 1 and plan.schedule == "interleaved-1f1b" and plan.virtual_stages > 1:
        layers = model.num_layers // (plan.G_inter * plan.virtual_stages) if model.num_layers else 0
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers}")
    if plan.G_inter > 1 and plan.schedule == "gpipe":
        notes.append("schedule gpipe: Megatron runs 1F1B (same time, less memory)")
    if getattr(plan, "sequence_parallel", False):
        args.append("--sequence-parallel")
    if plan.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif plan.recompute == "selective":
        args.append("--recompute-granularity selective")
    if plan.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero_stage > 1:
        notes.append(f"zero_stage={plan.zero_stage}: Megatron shards optimizer states only "
                     "(--use-distributed-optimizer, ZeRO-1); use DeepSpeed or FSDP for stages 2-3")
    if training.dtype in ("bf16", "fp16"):
        args.append(f"--{training.dtype}")
    elif training.dtype == "fp8":
        args += ["--bf16", "--fp8-format hybrid"]
    if model.num_layers and model.hidden_size:
        args += [
            f"--num-layers {model.num_layers}",
            f"--hidden-size {model.hidden_size}",
            f"--num-attention-heads {model.num_attention_heads}",
            f"--ffn-hidden-size {model.ffn_hidden_size}",
            f"--seq-length {model.seq_length}",
            f"--max-position-embeddings {model.seq_length}",
        ]
        groups = getattr(model, "num_query_groups", None)
        if groups and groups != model.num_attention_heads:
            args += ["--group-query-attention", f"--num-query-groups {groups}"]
        if getattr(model, "gated_mlp", False):
            args.append("--swiglu")
    else:
        notes.append("the model is a list of layers: give Megatron its shape yourself")
    order = [a for a in plan.order if a in ("row", "inter", "data")]
    if plan.G_inter > 1 and plan.G_data > 1 and order.index("inter") < order.index("data"):
        args.append("--use-tp-pp-dp-mapping")  # gridtune's order: pipeline stages inside data replicas
    if order[0] != "row" and plan.G_intra_r > 1:
        notes.append(
            f"placement {'/'.join(plan.order)}: Megatron always puts tensor-parallel ranks innermost"
        )
    cmd = _torchrun(cluster, plan, "pretrain_gpt.py")
    text = " \\\n    ".join([" ".join(cmd), *args])
    return Launch(kind="megatron", text=text, args=tuple(args), notes=tuple(notes))


def deepspeed(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """A DeepSpeed config (ds_config.json); pipeline and tensor parallelism are set in the training code."""
    notes: list[str] = []
    data_ranks = plan.G_data * plan.G_intra_d
    config: dict[str, Any] = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": _microbatches(training, plan),
        "zero_optimization": {"stage": plan.zero_stage if plan.G_intra_d == 1 else 3,
                              "overlap_comm": True, "contiguous_gradients": True},
        "gradient_clipping": 1.0,
    }
    if plan.G_intra_d > 1 and plan.zero_stage < 3:
        notes.append(
            f"G_intra_d={plan.G_intra_d} shards parameters over depth: that is ZeRO-3 over those ranks "
            "(stage 3 set); DeepSpeed then shards over all data ranks, not only depth (use "
            "zero_hpz_partition_size / MiCS for hybrid sharding)"
        )
    if training.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif training.dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if plan.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": plan.G_intra_r > 1,
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
        notes.append(f"recompute={plan.recompute}: wrap the blocks with deepspeed.checkpointing.checkpoint")
    if plan.G_inter > 1:
        notes.append(f"G_inter={plan.G_inter}: build the model as deepspeed.pipe.PipelineModule(layers, "
                     f"num_stages={plan.G_inter}) (1F1B schedule)")
    if plan.G_intra_r > 1 or plan.G_intra_c > 1:
        notes.append(f"tensor parallelism {plan.G_intra_r}x{plan.G_intra_c}: DeepSpeed itself has none; "
                     f"Megatron-DeepSpeed takes --tensor-model-parallel-size {plan.G_intra_r} (1D only)")
    notes.append(f"{data_ranks} data-parallel ranks x {plan.G_inter} stages x "
                 f"{plan.G_intra_r * plan.G_intra_c} tensor ranks")
    nnodes, per_node = _nodes(cluster, plan)
    cmd = (f"deepspeed --num_nodes {nnodes} --num_gpus {per_node} train.py "
           "--deepspeed --deepspeed_config ds_config.json")
    text = json.dumps(config, indent=2) + "\n# launch: " + cmd
    return Launch(kind="deepspeed", text=text, config=config, args=(cmd,), notes=tuple(notes))


def torchrun(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """The gridtune engine: the torchrun line and the `engine.init(...)` call for this plan."""
    cmd = _torchrun(cluster, plan, "train.py")
    placement = (
        "" if plan.order == ("col", "row", "depth", "inter", "data") else f", placement={plan.order!r}"
    )
    init = (f"engine.init(G_data={plan.G_data}, G_inter={plan.G_inter}, G_intra_d={plan.G_intra_d}, "
            f"G_intra_r={plan.G_intra_r}, G_intra_c={plan.G_intra_c}{placement})")
    python = "\n".join(
        [
            "import engine",
            init,
            f"loader = engine.create_dataloader(dataset, global_batch_size={training.global_batch_size})",
            f"# or: engine.train(model, dataset, global_batch_size={training.global_batch_size}, steps=..., "
            "auto=False,",
            f"#                  plan=perfmodels.io.plan_from_dict({json.dumps(_plan_dict(plan))}))",
        ]
    )
    text = " ".join(shlex.quote(c) if "$" not in c else c for c in cmd) + "\n\n# train.py\n" + python
    return Launch(kind="torchrun", text=text, args=tuple(cmd), config={"init": init}, notes=())


def _plan_dict(plan: Plan) -> dict[str, Any]:
    from perfmodels.io import plan_to_dict

    return plan_to_dict(plan)


def launch_for(kind: str, model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """The launch of `plan` for `kind` (one of KINDS)."""
    builders = {"megatron": megatron, "deepspeed": deepspeed, "torchrun": torchrun}
    if kind not in builders:
        raise ValueError(f"--emit must be one of {list(KINDS)}, got {kind!r}")
    return builders[kind](model, cluster, training, plan)


def all_launches(model: Model, cluster: Cluster, training: Training, plan: Plan) -> dict[str, dict[str, Any]]:
    """{kind: Launch.to_dict()} for every kind (the REST answer's `launch`)."""
    return {k: launch_for(k, model, cluster, training, plan).to_dict() for k in KINDS}
