"""Megatron-LM: `pretrain_gpt.py` arguments for a plan ranked for the megatron-core (or megatron-lm)
stack.

Flags as Megatron-LM's `megatron/training/arguments.py` defines them (NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553). `transformer_config(...)` is the same layout as
Megatron-Core `TransformerConfig` keyword arguments: the NeMo emitter writes them as recipe
overrides, and tests/tuner/test_launch_frameworks.py builds a real `TransformerConfig` from them.
"""

from __future__ import annotations

import shlex
from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch.common import Launch, Layout, join_command, layout_of, moe_fields, torchrun

_MOE_FLAGS = {
    "num_moe_experts": "--num-experts",
    "moe_router_topk": "--moe-router-topk",
    "moe_ffn_hidden_size": "--moe-ffn-hidden-size",
    "moe_shared_expert_intermediate_size": "--moe-shared-expert-intermediate-size",
    "moe_layer_freq": "--moe-layer-freq",
    "kv_channels": "--kv-channels",
    "q_lora_rank": "--q-lora-rank",
    "kv_lora_rank": "--kv-lora-rank",
    "qk_head_dim": "--qk-head-dim",
    "qk_pos_emb_head_dim": "--qk-pos-emb-head-dim",
    "v_head_dim": "--v-head-dim",
}


def transformer_config(model: Model, training: Training, plan: Plan, lay: Layout) -> dict[str, Any]:
    """Megatron-Core `TransformerConfig` keyword arguments (its field names) for this plan."""
    cfg: dict[str, Any] = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "context_parallel_size": lay.cp,
        "expert_model_parallel_size": lay.ep,
        "sequence_parallel": bool(plan.sequence_parallel),
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": int(model.num_query_groups),
        "ffn_hidden_size": int(model.ffn_hidden_size),
        "gated_linear_unit": bool(model.gated_mlp),
        # GPT-style blocks carry biases, the Llama family none (--disable-bias-linear below)
        "add_bias_linear": not model.gated_mlp,
        "hidden_dropout": 0.1 if model.dropout else 0.0,
        "attention_dropout": 0.1 if model.dropout else 0.0,
        "bf16": training.dtype in ("bf16", "fp8"),
        "fp16": training.dtype == "fp16",
    }
    if lay.etp is not None:
        cfg["expert_tensor_parallel_size"] = lay.etp
    if lay.vpp > 1:
        cfg["virtual_pipeline_model_parallel_size"] = lay.vpp
    if lay.uneven:
        cfg["num_layers_in_first_pipeline_stage"] = lay.first_stage_layers
        cfg["num_layers_in_last_pipeline_stage"] = lay.last_stage_layers
    if lay.pipeline_layout is not None:
        cfg["pipeline_model_parallel_layout"] = lay.pipeline_layout
    if plan.recompute == "full":
        cfg.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif plan.recompute == "selective":
        cfg["recompute_granularity"] = "selective"
    if training.dtype == "fp8":
        cfg["fp8"] = "hybrid"
    cfg.update(moe_fields(model))
    if cfg.get("num_moe_experts"):
        cfg["moe_grouped_gemm"] = True
        cfg["moe_token_dispatcher_type"] = "alltoall"
        if cfg["moe_router_topk"] == 1:
            # a softmax over one selected score has a zero gradient: Megatron-Core requires the
            # softmax before the top-k when k is 1 (transformer_config.py, "Please use
            # --moe-router-pre-softmax when topk is 1", megatron-core 0.16.0)
            cfg["moe_router_pre_softmax"] = True
    return cfg


def cuda_connections_env(lay: Layout, fsdp: bool) -> list[str]:
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context parallelism before
    Blackwell (arguments.py, `validate_args`), and Megatron FSDP asserts it is not 1 (:1165)."""
    if fsdp:
        return []
    return ["CUDA_DEVICE_MAX_CONNECTIONS=1"] if lay.tp > 1 or lay.cp > 1 else []


def megatron(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """pretrain_gpt.py arguments: the whole layout, batch, recomputation, optimizer sharding,
    precision and the overlaps the stack preset assumes."""
    stack = training.effective_stack
    lay = layout_of(model, training, plan)
    notes: list[str] = []
    args = [
        f"--tensor-model-parallel-size {lay.tp}",
        f"--pipeline-model-parallel-size {lay.pp}",
    ]
    if lay.cp > 1:
        args.append(f"--context-parallel-size {lay.cp}")
    if lay.ep > 1:
        args.append(f"--expert-model-parallel-size {lay.ep}")
    if lay.etp is not None:
        args.append(f"--expert-tensor-parallel-size {lay.etp}")
    if lay.pipeline_layout is not None:  # the layout sets the virtual size too (arguments.py:927-950)
        args.append(f"--pipeline-model-parallel-layout {shlex.quote(lay.pipeline_layout)}")
    elif lay.vpp > 1:
        if lay.uneven:  # arguments.py:955: uneven stages take the virtual size, not layers per chunk
            args.append(f"--num-virtual-stages-per-pipeline-rank {lay.vpp}")
        else:
            args.append(f"--num-layers-per-virtual-pipeline-stage {model.num_layers // (lay.pp * lay.vpp)}")
    if lay.uneven:
        args += [f"--decoder-first-pipeline-num-layers {lay.first_stage_layers}",
                 f"--decoder-last-pipeline-num-layers {lay.last_stage_layers}"]
    args += [f"--micro-batch-size {lay.micro_batch_size}", f"--global-batch-size {lay.global_batch_size}"]
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif plan.recompute == "selective":
        args.append("--recompute-granularity selective")
    fsdp = plan.zero_stage == 3
    if plan.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    elif fsdp:  # Megatron FSDP: arguments.py:1118-1170 (ckpt format fsdp_dtensor), :3190; its default
        # version 1 (:3158) runs with the distributed optimizer (:1129-1135)
        args += ["--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy optim_grads_params", "--ckpt-format fsdp_dtensor"]
    elif plan.zero_stage == 2:
        raise ValueError("zero_stage=2: Megatron-LM has no ZeRO-2 optimizer (rank with the megatron stack's "
                         "launchable stages, --emit megatron)")
    if stack.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if stack.overlap_param_gather and plan.zero_stage >= 1:
        args.append("--overlap-param-gather")  # arguments.py:1025: only with the distributed optimizer/FSDP
    if stack.overlap_tp_comm:
        if plan.sequence_parallel:
            args.append("--tp-comm-overlap")  # arguments.py:1442 requires sequence parallelism
        else:
            notes.append("the stack overlaps tensor-parallel communication, which Megatron does only with "
                         "--sequence-parallel: this plan runs without it")
    if stack.grad_bytes_bf16 == 2.0 and training.dtype in ("bf16", "fp8"):
        args.append("--grad-reduce-in-bf16")
    if not stack.flash_attention:
        args.append("--attention-backend unfused")
    if training.dtype in ("bf16", "fp16"):
        args.append(f"--{training.dtype}")
    elif training.dtype == "fp8":
        args += ["--bf16", "--fp8-format hybrid"]
    if model.num_layers and model.hidden_size and not model.layers:
        args += [
            f"--num-layers {model.num_layers}",
            f"--hidden-size {model.hidden_size}",
            f"--num-attention-heads {model.num_attention_heads}",
            f"--ffn-hidden-size {model.ffn_hidden_size}",
            f"--seq-length {model.seq_length}",
            f"--max-position-embeddings {model.seq_length}",
            f"--vocab-size {model.vocab_size}",
            "--tokenizer-type NullTokenizer",
        ]
        groups = int(model.num_query_groups)
        if groups != model.num_attention_heads:
            args += ["--group-query-attention", f"--num-query-groups {groups}"]
        if model.gated_mlp:  # the Llama family: SwiGLU, RMSNorm, RoPE, no biases
            args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope",
                     "--disable-bias-linear"]
        if not model.tied_embeddings:
            args.append("--untie-embeddings-and-output-weights")
        if not model.dropout:
            args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
        extra = moe_fields(model)
        if extra.get("multi_latent_attention"):
            args.append("--multi-latent-attention")
        for name, flag in _MOE_FLAGS.items():
            if name in extra:
                value = extra[name]
                if isinstance(value, list):  # moe_freq_type evaluates a quoted Python list
                    args.append(f"{flag} '[{','.join(str(x) for x in value)}]'")
                else:
                    args.append(f"{flag} {value}")
        if extra.get("num_moe_experts"):
            args += ["--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall"]
            if extra["moe_router_topk"] == 1:  # see transformer_config
                args.append("--moe-router-pre-softmax")
    else:
        notes.append("the model is a list of layers: give Megatron its shape yourself")
    order = [a for a in plan.order if a in ("inter", "data")]
    if lay.pp > 1 and lay.dp > 1 and order.index("inter") < order.index("data"):
        args.append("--use-tp-pp-dp-mapping")  # pipeline stages inside data replicas (gridtune's default)
    notes.append("add your data (--data-path or --mock-data), tokenizer and learning-rate schedule")
    env = cuda_connections_env(lay, fsdp)
    cmd = torchrun(cluster, lay.world, ["pretrain_gpt.py"])
    text = join_command([*env, *cmd], args)
    return Launch(kind="megatron", stack=stack.name, text=text, args=tuple(args),
                  config={"env": env, "transformer_config": transformer_config(model, training, plan, lay)},
                  notes=tuple(notes))
