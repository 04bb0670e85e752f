"""PyTorch FSDP as LLM Foundry runs it: a training YAML for `composer train/train.py`, for a plan
ranked for the fsdp stack (data parallelism only: ZeRO-0/2/3 are FSDP's NO_SHARD, SHARD_GRAD_OP and
FULL_SHARD sharding strategies; LLM Foundry's `fsdp_config` and `global_train_batch_size` /
`device_train_microbatch_size` keys, mosaicml/llm-foundry scripts/train/yamls/pretrain)."""

from __future__ import annotations

from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch.common import Launch, layout_of, nodes

STRATEGIES = {0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}
PRECISION = {"bf16": "amp_bf16", "fp16": "amp_fp16", "fp8": "amp_fp8", "fp32": "fp32", "tf32": "fp32"}


def foundry_config(model: Model, training: Training, plan: Plan) -> dict[str, Any]:
    lay = layout_of(model, training, plan, uneven=False)
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        raise ValueError("the fsdp stack runs data parallelism only")
    if plan.zero_stage not in STRATEGIES:
        raise ValueError(f"zero_stage={plan.zero_stage}: FSDP shards as ZeRO-0, 2 or 3")
    stack = training.effective_stack
    groups = int(model.num_query_groups)
    attn: dict[str, Any] = {"attn_impl": "flash" if stack.flash_attention else "torch"}
    if groups != model.num_attention_heads:
        attn.update(attn_type="grouped_query_attention", kv_n_heads=groups)
    mpt: dict[str, Any] = {
        "name": "mpt_causal_lm", "d_model": model.hidden_size, "n_heads": model.num_attention_heads,
        "n_layers": model.num_layers, "expansion_ratio": int(model.ffn_hidden_size) / model.hidden_size,
        "max_seq_len": model.seq_length, "vocab_size": model.vocab_size, "attn_config": attn, "no_bias": True,
    }
    if model.gated_mlp:  # the Llama family in MPT's terms: SwiGLU FFN, RoPE, RMSNorm
        mpt.update(ffn_config={"ffn_type": "mptglu"}, norm_type="rmsnorm", learned_pos_emb=False)
        attn["rope"] = True
    return {
        "max_seq_len": model.seq_length,
        "model": mpt,
        "global_train_batch_size": lay.global_batch_size,
        "device_train_microbatch_size": lay.micro_batch_size,
        "precision": PRECISION[training.dtype],
        "fsdp_config": {"sharding_strategy": STRATEGIES[plan.zero_stage], "mixed_precision": "PURE",
                        "activation_checkpointing": plan.recompute == "full",
                        "activation_checkpointing_reentrant": False, "activation_cpu_offload": False,
                        "limit_all_gathers": True, "backward_prefetch": "BACKWARD_PRE",
                        "forward_prefetch": bool(stack.overlap_param_gather)},
    }


def _yaml(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for key, v in value.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{key}:")
            lines += _yaml(v, indent + 1)
        else:
            text = "true" if v is True else "false" if v is False else str(v)
            lines.append(f"{pad}{key}: {text}")
    return lines


def fsdp(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    config = foundry_config(model, training, plan)
    lay = layout_of(model, training, plan, uneven=False)
    n, per_node = nodes(cluster, lay.world)
    cmd = (f"composer --nproc {per_node} --world_size {lay.world} --node_rank $NODE_RANK "
           f"--master_addr $MASTER_ADDR train/train.py gridtune.yaml" if n > 1
           else "composer train/train.py gridtune.yaml")
    text = "\n".join(["# gridtune.yaml", *_yaml(config), "# launch:", cmd])
    notes = ("add your tokenizer, train_loader, optimizer and scheduler sections",)
    if plan.recompute == "selective":
        notes += ("selective recomputation: LLM Foundry checkpoints whole blocks only",)
    return Launch(kind="fsdp", stack=training.effective_stack.name, text=text, args=(cmd,), config=config,
                  notes=notes)
