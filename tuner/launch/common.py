"""What every emitter shares: the `Launch` answer, the plan's layout in the frameworks' terms
(`Layout`: TP, PP, VPP, CP, EP, ETP, data-parallel size, micro-batches, the uneven pipeline split),
and the torchrun line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfmodels import rules
from perfmodels.specs import Cluster, Model, Plan, Training


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One way to run a plan: `text` to paste (a command line, a config file and its command), the
    `args` or `config` it was made from, and `notes` on what the user must still set."""

    kind: str
    stack: str = ""
    text: str
    args: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "stack": self.stack, "text": self.text, "args": list(self.args),
                "config": self.config, "notes": list(self.notes)}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A plan in the frameworks' words. `dp` is the data-parallel size the framework sees (G_data:
    the stacks that launch here have no depth axis); `ep`/`etp` follow Megatron-Core's MoE folding
    (etp None: the framework's default, the tensor-parallel size)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    etp: int | None
    dp: int
    world: int
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    first_stage_layers: int | None
    last_stage_layers: int | None
    interleaved: bool
    pipeline_layout: str | None = None
    """Megatron-Core's `--pipeline-model-parallel-layout` where the layers split neither evenly nor
    with first/last-stage counts (`perfmodels.rules.megatron_layout`)."""

    @property
    def uneven(self) -> bool:
        return self.first_stage_layers is not None


def layout_of(model: Model, training: Training, plan: Plan, *, uneven: bool = True) -> Layout:
    """The layout of `plan`; `uneven` asks for Megatron's first/last-stage counts where the layers do
    not split evenly, or, on a stack that has it, a custom pipeline layout where those do not work
    either (ValueError when nothing works)."""
    cp = int(getattr(plan, "G_cp", 1) or 1)
    ep = int(getattr(plan, "G_ep", 1) or 1)
    etp = getattr(plan, "G_etp", None)
    dp = plan.G_data * plan.G_intra_d
    interleaved = plan.G_inter > 1 and plan.schedule == "interleaved-1f1b" and plan.virtual_stages > 1
    vpp = plan.virtual_stages if interleaved else 1
    first = last = layout = None
    if uneven and plan.G_inter > 1 and model.num_layers:
        try:
            split = rules.megatron_first_last(model.num_layers, plan.G_inter, vpp)
        except ValueError:
            if training.effective_stack.pipeline_layer_split != "megatron-core":
                raise
            split, layout = None, rules.megatron_layout(model.num_layers, plan.G_inter, vpp)
        if split is not None:
            first, last = split
    world = plan.G_data * plan.G_inter * plan.G_intra_d * plan.G_intra_r * plan.G_intra_c * cp
    return Layout(tp=plan.G_intra_r, pp=plan.G_inter, vpp=vpp, cp=cp, ep=ep,
                  etp=None if etp is None else int(etp), dp=dp, world=world,
                  micro_batch_size=plan.micro_batch_size, global_batch_size=training.global_batch_size,
                  num_microbatches=training.global_batch_size // (dp * plan.micro_batch_size),
                  first_stage_layers=first, last_stage_layers=last, interleaved=interleaved,
                  pipeline_layout=layout)


def nodes(cluster: Cluster, world: int) -> tuple[int, int]:
    """(nodes, processes per node) for `world` ranks on this cluster."""
    per_node = min(cluster.gpus_per_node, world)
    return max(1, math.ceil(world / per_node)), per_node


def torchrun(cluster: Cluster, world: int, script: list[str]) -> list[str]:
    n, per_node = nodes(cluster, world)
    cmd = ["torchrun", f"--nnodes={n}", f"--nproc-per-node={per_node}"]
    if n > 1:
        cmd += ["--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:29500"]
    return [*cmd, *script]


def moe_fields(model: Model) -> dict[str, Any]:
    """The model's MoE and attention-shape fields that are set (read with getattr: the fields exist
    once the MoE/CP contract's Model lands), in Megatron-Core's names."""
    out: dict[str, Any] = {}
    experts = getattr(model, "num_moe_experts", None)
    if experts:
        out["num_moe_experts"] = int(experts)
        out["moe_router_topk"] = int(getattr(model, "moe_router_topk", 2) or 2)
        ffn = getattr(model, "moe_ffn_hidden_size", None)
        out["moe_ffn_hidden_size"] = int(ffn or model.ffn_hidden_size)
        shared = getattr(model, "moe_shared_expert_intermediate_size", None)
        if shared:
            out["moe_shared_expert_intermediate_size"] = int(shared)
        freq = getattr(model, "moe_layer_freq", 1)
        if freq not in (None, 1):
            out["moe_layer_freq"] = list(freq) if isinstance(freq, (list, tuple)) else int(freq)
    kv = getattr(model, "kv_channels", None)
    if kv:
        out["kv_channels"] = int(kv)
    if getattr(model, "multi_latent_attention", False):
        out["multi_latent_attention"] = True
        for name in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            value = getattr(model, name, None)
            if value is not None:
                out[name] = int(value)
    return out


def join_command(parts: list[str], args: list[str]) -> str:
    """A command line with one argument per continued line."""
    return " \\\n    ".join([" ".join(parts), *args])
