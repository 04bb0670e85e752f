"""The training stack: which software runs the layout, and what that software does.

Two runs of the same layout on the same cluster differ by 2x when one uses Megatron-LM 2021
(unfused attention, every layer recomputed, a blocking data-parallel all-reduce) and the other
Megatron-Core 2024 (flash attention, distributed optimizer, everything overlapped). The model cannot
guess this: a `Stack` states it. `Training.stack` names a preset (or is a `Stack`); each behaviour
can still be overridden one by one on `Training` (e.g. `Training(stack="megatron-core",
overlap_grad_reduce=False)`).

    from perfmodels import stacks
    stacks.preset("fsdp")                                # LLM Foundry / Composer FSDP
    stacks.preset("megatron-core", overlap_tp_comm=True)  # with one option changed

Every field documents the framework behaviour it encodes. Memory per parameter in mixed
precision (bf16/fp16/fp8 compute), before ZeRO sharding, by stack (d = G_data):

- megatron-lm, megatron-core: weights 2, gradients 4 (fp32 main_grad for bf16: Megatron-LM turns
  `accumulate_allreduce_grads_in_fp32` on whenever --bf16 is given; 2 for fp16), fp32 master + Adam
  12 (/d with the distributed optimizer); dist-opt (ZeRO-1): 6 + 12/d, Apex DFA (ZeRO-2): 4 + 10/d;
- nemo: as megatron-core with bf16 gradient buffers (2): dist-opt 4 + 12/d; Megatron FSDP (ZeRO-3);
- megatron-deepspeed, deepspeed: weights 2, gradients 2 (+ 4 fp32 accumulator in bf16), master + Adam
  12; ZeRO-2 keeps only its gradient shard;
- fsdp, torchtitan: weights 4 (fp32 flat parameter), gradients 4, Adam 8; FULL_SHARD: all /d, bf16
  copies only of the units being computed;
- gridtune: weights 4 (fp32, autocast casts per op), gradients 4, Adam 8: what `engine` holds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, get_args

import numpy as np

GradReduceTiming = Literal["per_step", "per_microbatch"]

TORCHTITAN_EAGER_ELEMENTWISE = 2.8
"""torchtitan's eager Llama block streams ~2.8x the element-wise bytes of a fused block (see
`Stack.elementwise_bytes_scale`: fp32 RMSNorm and complex fp32 RoPE; counted per op, not fitted)."""
EAGER_LOSS_BYTES_PER_LOGIT = 12.0
"""Bytes per logit when eager cross entropy over fp32-upcast logits starts its backward (2 + 4 + 4 + 2)."""
LOSS_PARALLEL_BYTES_PER_LOGIT = 16.0
"""Bytes per logit at the peak of PyTorch's `loss_parallel` cross entropy (DTensor, vocabulary split
over the tensor-parallel ranks; torch/distributed/tensor/parallel/loss.py). Its log-softmax and NLL
are decomposed into separate fp32 ops around the all-reduces: the forward holds the 16-bit logits,
their fp32 upcast, the shifted logits and their exponentials (2 + 4 + 4 + 4 = 14); the fused
backward holds the saved log-softmax 4, a zero-filled gradient 4, exp of the log-softmax 4 and their
sum 4 (16), where eager `F.cross_entropy` on one rank holds 12."""
COMPILED_LOSS_BYTES_PER_LOGIT = 4.0
"""Bytes per logit of a cross entropy compiled by torch.compile (Inductor fuses the fp32 upcast,
log-softmax and NLL into one reduction that saves only its 16-bit input and a per-row logsumexp, and
writes the 16-bit gradient directly): the saved logits 2 + their gradient 2."""
TorchCompile = Literal["none", "blocks", "blocks+loss"]
TORCH_COMPILE_VALUES: tuple[str, ...] = get_args(TorchCompile)
"""What `Stack.torch_compile` may say (the one list the specs, the loader and the REST schema use)."""
FlashKernel = Literal["native", "pre-hopper"]
FLASH_KERNEL_VALUES: tuple[str, ...] = get_args(FlashKernel)
"""What `Stack.flash_kernel` may say (the one list the specs, the loader, the CLI and the REST schema use)."""
SelectiveKind = Literal["attention-core", "per-op"]
PipelineSplit = Literal["any", "megatron", "megatron-core", "torchtitan"]
PIPELINE_SPLIT_VALUES: tuple[str, ...] = get_args(PipelineSplit)
"""What `Stack.pipeline_layer_split` may say."""


@dataclass(frozen=True, kw_only=True)
class Stack:
    """What one training framework does with a layout. Units are in the field names.

    Overlap:
    - `overlap_grad_reduce`: the data-parallel gradient reduction runs in buckets behind the last
      micro-batch's backward (PyTorch DDP, Megatron `--overlap-grad-reduce`, FSDP). False: it runs
      after the backward (Megatron-LM's local DDP before 2023, the DeepSpeed pipeline engine, which
      reduces after the whole pipeline schedule).
    - `overlap_param_gather`: ZeRO-3/FSDP prefetch the next unit's parameters while the current one
      computes (FSDP forward/backward prefetch, DeepSpeed's prefetch bucket); the distributed
      optimizer's parameter all-gather overlaps the next forward (Megatron `--overlap-param-gather`).
    - `overlap_tp_comm`: tensor-parallel collectives overlap GEMMs (Transformer Engine userbuffers,
      Megatron `--tp-comm-overlap`; AxoNN's asynchronous backward all-reduce).
    - `overlap_depth_comm`: the depth axis' weight all-gathers are prefetched one layer ahead and its
      reduce-scatters run asynchronously (AxoNN's `optimize_communication`).
    Gradient reduction timing:
    - `zero2_grad_reduce`: "per_step" when ZeRO-2 still accumulates micro-batches into a full
      gradient buffer and reduce-scatters once per step behind the last backward (Megatron-Core's
      distributed optimizer, Apex DistributedFusedAdam in NeMo), "per_microbatch" when it keeps only
      its shard and so reduce-scatters after every micro-batch's backward (DeepSpeed ZeRO-2, FSDP
      SHARD_GRAD_OP).
    - `zero3_gather`: ZeRO-3 gathers parameters per block ("layer": FSDP's wrapped blocks, DeepSpeed
      since it coalesces) or per parameter tensor ("tensor": DeepSpeed ZeRO-3 of 2021).
    Kernels and host:
    - `flash_attention`: fused attention without the s x s score matrix (FlashAttention, cuDNN
      fused attention, PyTorch SDPA).
    - `flash_kernel`: "native" when the fused attention kernel is tuned for the GPU it runs on (the GPU
      preset's flash efficiencies: cuDNN / Transformer Engine, PyTorch SDPA as measured), "pre-hopper"
      when it was written for Ampere and so on Hopper reaches only what its mma.sync instructions
      allow (`perfmodels.compute.flash_rates`): MPT's Triton FlashAttention as LLM
      Foundry ran it in 2023, and FlashAttention-2, which PyTorch's SDPA runs as its flash backend.
      SDPA on Hopper picked FlashAttention-2 before cuDNN attention (a Hopper kernel): cuDNN was made
      opt-in after the 2.5 release (pytorch/pytorch#138522; #142132 shows a December 2024 nightly's
      default SDPA at 329 TFLOP/s on an H100 where cuDNN ran 631) until torch 2.9 made it the default
      on sm90 (#162073; later gated on the cuDNN and CUDA versions). torchtitan pinned the order
      itself: flash first, with cuDNN only on B200 at e7c0cae (June 2025,
      `ScaledDotProductAttention._init_backend`); cuDNN first on every GPU from September 2025.
      So a 2024-25 torchtitan run on an H100 or H200 ran a pre-Hopper kernel, a current one a native
      kernel (the preset's default); say which with `Training.flash_kernel`.
    - `selective_recompute`: what `recompute="selective"` means: "attention-core" (Megatron:
      recompute the softmax/dropout over the scores; nothing to do once attention is fused) or
      "per-op" (torchtitan's op-level policy: keep matmul and attention outputs, recompute the
      element-wise ops).
    - `full_recompute_repeats_layer`: what `recompute="full"` repeats in backward. True: the whole
      checkpointed layer, its last GEMM and last collective included (reentrant checkpointing reruns
      the checkpointed function and backpropagates through what it recomputed; non-reentrant
      checkpointing with early stopping off reruns the function to its end too). False: PyTorch's
      non-reentrant `torch.utils.checkpoint` with early stopping (its default: `checkpoint(...,
      early_stop=True)`, "Rule 5" and `_recomputation_hook.pack_hook` raising
      `_StopRecomputationError` once as many tensors are saved as in the forward; torch/utils/
      checkpoint.py at pytorch/pytorch 0008d771, torch 2.13): recomputation stops at the last tensor
      the layer saved for backward. An ATen linear saves its inputs before it multiplies, so a dense
      block's fc2 GEMM and the collective after it (its output all-reduce, or reduce-scatter under
      sequence parallelism; the shared expert's fc2 in an MoE layer) are not repeated, but an MoE
      layer's combine all-to-all is: the gate weighting and the unpermute after it save tensors
      (`perfmodels.experts.add_events`). By stack:
      - megatron-core, nemo: True. `TransformerBlock` runs full recomputation through
        `checkpointed_forward` (megatron/core/transformer/transformer_block.py:663 and
        megatron/core/recompute.py:125-148 at NVIDIA/Megatron-LM d98e8a64): its own reentrant
        `CheckpointFunction` (tensor_parallel/random.py:591-672; backward reruns `ctx.run_function`
        at 659 and calls `torch.autograd.backward(outputs, args)` at 668), or under FP8
        Transformer Engine's `checkpoint`, whose `use_reentrant` defaults to True
        (transformer_engine/pytorch/distributed.py:694-703 at NVIDIA/TransformerEngine d0067d0;
        Megatron's `te_checkpoint` passes none, extensions/transformer_engine.py:3402-3426).
      - megatron-lm: True (megatron/mpu/random.py `CheckpointFunction`:254-319, called from
        megatron/model/transformer.py:619 at NVIDIA/Megatron-LM 6985e589).
      - megatron-deepspeed, deepspeed: True. Megatron-DeepSpeed's `tensor_parallel.checkpoint`
        calls `deepspeed.checkpointing.checkpoint` when configured, else Megatron's reentrant
        `CheckpointFunction` (megatron/core/tensor_parallel/random.py:323-331 at
        microsoft/Megatron-DeepSpeed f4157be); DeepSpeed's `checkpoint` is `CheckpointFunction.apply`
        (deepspeed/runtime/activation_checkpointing/checkpointing.py:948-953 at microsoft/DeepSpeed
        38327e0), whose backward reruns the function (653-654) and backpropagates (680).
      - fsdp: False. LLM Foundry's benchmark configs set `activation_checkpointing_reentrant: false`
        (scripts/train/yamls/pretrain/mpt-7b.yaml:91 at mosaicml/llm-foundry 495218376), so
        Composer wraps each block in `checkpoint_wrapper(CheckpointImpl.NO_REENTRANT)`
        (composer/trainer/dist_strategy.py:670-673 at mosaicml/composer d341aa0). In FP8 Composer
        uses Transformer Engine's non-reentrant checkpoint instead, which "does not support early
        stopping, and will execute the entire forward" (distributed.py:676-678 above): the FP8
        exception of `perfmodels.compute` (its GEMMs are repeated; the stack has no tensor
        parallelism, so no collective changes). Early stopping became torch's default in 2.1
        (pytorch/pytorch#96866, March 2023); before it non-reentrant checkpointing reran the whole
        function. LLM Foundry's A100 tables were measured on torch 1.13.1 ("TODO: Update tables
        with torch 2.0", scripts/train/benchmarking/README.md, and `torch==1.13.1` in setup.py at
        1ef7b4d), its H100 large-scale table on torch 2.1.0 (setup.py at 5e85bd6): for a run on
        torch 2.0 or older say `Training(full_recompute_repeats_layer=True)`.
      - torchtitan: False, as the published runs ran it: `ptd_checkpoint_wrapper(module,
        preserve_rng_state=False)` (non-reentrant, torch's early stop; torchtitan/parallelisms/
        parallelize_llama.py:238 at pytorch/torchtitan ba24697, December 2024). Since 25413d2
        (2025-08-29, "Add config to AC to toggle early-stop", `activation_checkpoint.early_stop:
        bool = False`) and hard-coded in `FullAC` (torchtitan/distributed/activation_checkpoint.py:
        166-181 at b5bcd76) full recomputation runs with early_stop=False: for a current torchtitan
        say `Training(full_recompute_repeats_layer=True)`.
      - oneflow: True. Its `CheckpointingPass` clones every op of a checkpointed subgraph into the
        backward pass (oneflow/core/job_rewriter/checkpointing_pass.cpp step 3.2 at
        Oneflow-Inc/oneflow 03b7b8a7).
      - gridtune: False (engine/parallel_gpt.py `run_block`: `checkpoint(block, x,
        use_reentrant=False)`).
    - `host_us_per_block`: CPU time to issue one transformer block's forward pass (None: the device
      family's default in `perfmodels.compute`). `host_exposed_fraction`: how much of it adds to the
      GPU time instead of hiding behind the queue of launched kernels (0: only a floor, CUDA's
      asynchronous launch hides it; 1: fully serial, as when the framework synchronizes the host
      around every layer's communication).
    - `host_scale`: the stack's host cost per block relative to the device default (used when
      `host_us_per_block` is None, so a CPU "device" keeps its zero floor).
    - `host_split_axis_costs`: (row, col, depth) fraction each split tensor axis adds to a block's
      host cost (the engine's 3D Linear issues more ops per block: casts, layout conversions, norm
      statistics), and `split_axis_memory_passes`: how much memory-bound traffic each split axis adds,
      as a fraction of the block's element-wise traffic.
    - `p2p_scatter_gather`: pipeline sends carry 1/G_intra_r of the activation and all-gather it over
      the row group on arrival (Megatron-LM's default).
    Memory (bytes per parameter in mixed precision; fp32 training holds 4 + 4 + 8 in every stack):
    - `weight_bytes`: the copy of the weights the model keeps (2: 16-bit model weights beside an
      fp32 master; 4: fp32 parameters that autocast or FSDP's mixed precision cast per use).
    - `master_bytes`: the fp32 master copy held by the optimizer (sharded from ZeRO-1 on).
    - `grad_bytes_bf16` / `grad_bytes_fp16`: the gradient accumulation buffer for bf16 and fp16
      training (Megatron accumulates bf16 gradients in an fp32 `main_grad`; fp16 keeps them 16-bit).
    - `fp32_grad_bytes_bf16`: a further fp32 gradient copy the optimizer keeps in bf16 training
      (DeepSpeed's BF16 optimizer accumulates in fp32 beside the bf16 gradients; sharded from ZeRO-2
      on; its FP16 optimizer has none).
    - `zero2_grad_bytes` / `zero2_master_bytes`: what ZeRO-2 holds instead where it is a different
      optimizer (None: as without it). In NeMo "ZeRO-2" is Apex's DistributedFusedAdam: bf16
      gradient buckets (2 bytes) and only the 16-bit remainder of each fp32 master weight (2 bytes,
      `store_param_remainders`), so 4 + 10/d bytes per parameter.
    - `optimizer_state_bytes`: Adam's two fp32 moments.
    - `fp8_saves_fp8_inputs`: FP8 training saves each linear layer's input for backward in FP8 (1 byte;
      Transformer Engine), rather than in 16 bits (torchao's Float8Linear as torchtitan ran it in 2024
      re-quantizes from the saved high-precision input: its published FP8 runs peak at the same
      memory as the bf16 ones, 76.8 vs 77.0 and 61.8 vs 62.0 GiB).
    - `moe_gates_in_experts`: a mixture-of-experts layer multiplies each (token, expert) row by its
      gate inside the expert, on the activation output before fc2 (Megatron-Core's `TEGroupedMLP`,
      which then unpermutes without probs), so fc2's output is not saved for backward; False: the
      gates weight the expert outputs after the combine, which saves them (`experts.activation_bytes`).
    - `grouped_linear_host_ops_per_expert`: host ops (in `experts.HOST_OPS_PER_BLOCK` units) each
      grouped linear of an MoE layer issues per local expert and forward, where the experts' GEMMs
      are launched one expert at a time: Transformer Engine's `GroupedLinear` on Hopper runs
      `nvte_multi_tensor_gemm`, which, unless `NVTE_USE_CUTLASS_GROUPED_GEMM` is set, calls
      `multi_stream_cublas_gemm`: one cuBLASLt GEMM per expert, set up and launched from the host
      in a loop over four streams (transformer_engine/common/gemm/cublaslt_gemm.cu at
      NVIDIA/TransformerEngine v2.9), beside `_GroupedLinear`'s per-expert Python loops
      (module/grouped_linear.py); 1 for Megatron-Core (and NeMo), whose `TEGroupedMLP` runs them,
      and for the stacks that loop over their experts (DeepSpeed-MoE, the engine); 0 where one
      kernel runs all experts (torchtitan's `torch._grouped_mm`).
    - `grouped_linear_fp8_host_ops_per_expert`: the further ops per local expert in FP8: Transformer
      Engine quantizes each expert's input (forward) and output gradient (backward) as a tensor of
      its own, `split_quantize` -> `multi_tensor_quantize_impl`, which has a fused multi-tensor kernel
      only for delayed scaling; under current scaling (the FP8 recipe of Megatron-Bridge's MoE
      benchmarks, `fp8_cs`) `Float8CurrentScalingQuantizer::quantize` launches three kernels per
      tensor: the amax, the scale from it and the cast (pytorch/csrc/quantizer.cpp and
      extensions/cast.cpp at v2.9); 3 for Megatron-Core.
    - `fp8_weight_cache_bytes`: Transformer Engine keeps FP8 copies (and transposes) of the linear
      weights between micro-batches when training in FP8 (per linear-layer parameter).
    - `context_gib`: CUDA context, cuBLAS/cuDNN workspaces and the framework's own allocations.
    - `comm_buffer_gib`: NCCL's buffers per communicator with peers (measured ~0.1-0.3 GiB each).
    - `fragmentation`: caching-allocator slack as a fraction of the activation memory.
    - `optimizer_step_bytes`: HBM bytes the Adam step streams per local parameter (a fused Adam: read
      master, moments, gradient, write them and the 16-bit copy: ~30; PyTorch's foreach AdamW runs
      several passes: ~94, measured on an H100).
    - `elementwise_bytes_scale`: HBM bytes its element-wise ops stream relative to a stack that fuses
      them (Megatron/Transformer Engine fuse norm+GEMM, bias+dropout+add and SwiGLU: 1). Eager
      PyTorch modules run each op as its own kernel: torchtitan's Llama (without torch.compile) upcasts
      RMSNorm to fp32 (x.float(), pow, mean, rsqrt-mul, cast back, weight: ~36 bytes per element where
      a fused norm moves 4) and rotates q and k as fp32 complex numbers (~20 bytes per element where
      fused RoPE moves 4): about 2.8x the fused traffic per block.
    - `loss_bytes_per_logit`: bytes per logit alive when the loss's backward starts (None: the
      16-bit logits and one fp32 buffer, Megatron's fused vocab-parallel cross entropy, 2 + 4).
      Eager `F.cross_entropy(logits.float(), ...)` holds the 16-bit logits, the fp32 log-softmax
      output, its fp32 gradient and the 16-bit gradient together: 2 + 4 + 4 + 2 = 12.
    - `loss_parallel_bytes_per_logit`: the same where the tensor-parallel ranks split the vocabulary
      and the loss runs on the shards (torchtitan's `loss_parallel`, DTensor's decomposed fp32
      log-softmax: `LOSS_PARALLEL_BYTES_PER_LOGIT`); None: as without tensor parallelism.
    - `sp_saves_gathered_inputs`: with sequence parallelism, the QKV and fc1 GEMMs save the
      full-sequence input their all-gather produced (DTensor's `ColwiseParallel` after
      `SequenceParallel` norms, as torchtitan runs it), where Megatron saves the sequence shard and
      all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2).
    - `torch_compile`: what torch.compile covers. "blocks": each transformer block is compiled
      (torchtitan's `training.compile`, per block): Inductor fuses every element-wise chain (fp32
      RMSNorm, RoPE, SwiGLU, residual adds) into single kernels, so the block streams the fused
      element-wise bytes (`elementwise_bytes_scale` no longer applies). "blocks+loss": the loss is
      compiled too (torchtitan from 2025 compiles `cross_entropy_loss` when `training.compile` is on;
      its December 2024 trainer left it eager, "compiling loss function causes CUDA errors"), so the
      loss holds `COMPILED_LOSS_BYTES_PER_LOGIT` per logit instead of `loss_bytes_per_logit`.
    - `vocab_parallel_embedding`: the word embedding's rows (vocabulary) are split over the
      tensor-parallel ranks (Megatron's VocabParallelEmbedding); the engine splits its hidden
      dimension over the col axis instead.
    What the stack can run (the tuner ranks only these; the published-run loader only considers these
    for options a row leaves open):
    - `schedules`: pipeline schedules it implements; `zero_stages`: the ZeRO stages it offers;
    - `tensor_parallel` (row-parallel Megatron-style), `tensor_parallel_3d` (G_intra_c and
      G_intra_d as well: AxoNN-style), `pipeline_parallel`, `sequence_parallel` (Megatron's, 2022).
    - `context_parallel`: G_cp > 1, ring attention over the sequence chunks (Megatron-Core
      `--context-parallel-size` with Transformer Engine's `cp_comm_type` p2p, NeMo; torchtitan's
      `context_parallel` ring; the engine's ring). DeepSpeed's Ulysses (all-to-all over heads) is a
      different algorithm this model does not cost, so the deepspeed preset says False.
    - `expert_parallel`: G_ep > 1 or G_etp > 1 for mixture-of-experts layers (Megatron-Core
      `--expert-model-parallel-size` / `--expert-tensor-parallel-size`, NeMo; torchtitan's
      `expert_parallel_degree`; DeepSpeed-MoE's `ep_size`; the engine's all-to-all dispatch).
    - `overlap_ep_comm`: under an interleaved pipeline schedule the expert all-to-alls of one
      micro-batch run behind the compute of another (Megatron-Core
      `--overlap-moe-expert-parallel-comm`, the "1F1B A2A overlap" of its combined 1F1B schedule,
      which needs virtual pipeline stages; Megatron-Bridge's MoE performance recipes turn it on):
      each all-to-all runs behind the compute node of the other micro-batch its schedule pairs it
      with (`experts.overlapped_exposed_s`). Otherwise they sit on the critical path.
    What the stack's launcher accepts beyond those (the rules in `perfmodels/launchable.py`, each
    citing the framework line that enforces it; the search applies them in `tuner/constraints.py`):
    - `tp_splits_query_groups`: the tensor-parallel ranks split the key/value groups, so G_intra_r
      must divide `num_query_groups` (Megatron-Core, torchtitan); False: a rank may hold a replicated
      group when there are fewer groups than ranks (the gridtune engine).
    - `pipeline_layer_split`: how the stack cuts the layers into G_inter x virtual_stages chunks:
      "megatron" (evenly, or unevenly through --decoder-first/last-pipeline-num-layers with equal
      middle stages), "torchtitan" (ceil(layers / chunks) layers per chunk must give exactly that
      many chunks), "any" (a balanced split of any count: DeepSpeed's PipelineModule, the engine).
    - `pipeline_max_zero_stage`: the highest ZeRO stage that runs with G_inter > 1 (DeepSpeed's
      pipeline engine: 1).
    - `launch_placements`: the rank orders (innermost first) the launcher can build, where it cannot
      build every one (None: any; an axis left out, such as "cp", sits where the default order has
      it). Megatron: tensor-parallel ranks innermost, then data inside pipeline (its default order
      tp-cp-ep-dp-pp) or pipeline inside data (--use-tp-pp-dp-mapping); torchtitan's mesh
      (pp, dp_replicate, dp_shard, cp, tp) and DeepSpeed's PipeModelDataParallelTopology (pipe, data,
      model): pipeline outermost.
    - `launch_recomputes`: the recomputation modes the launcher offers where it lacks one (None: all
      three): DeepSpeed's and LLM Foundry's activation checkpointing and the engine recompute whole
      blocks only, so "selective" is not theirs.
    - `launch_tp_with_pp`: tensor and pipeline parallelism run together. Plain DeepSpeed's tensor
      parallelism is AutoTP, which gives the engine its own tensor x data mesh
      (deepspeed/runtime/engine.py `_configure_tensor_parallel`) where the pipeline engine takes its
      grid from the PipelineModule's topology: both at once need Megatron-DeepSpeed's one mpu.
    - `launch_zero_stages`: the ZeRO stages today's launcher of this stack offers, where they are
      fewer than `zero_stages` (None: all of them). `zero_stages` stays what published runs of the
      stack used (the loader's candidates): megatron-core's ZeRO-2 is Apex's DistributedFusedAdam as
      NeMo 1.x ran it, which Megatron-LM's pretrain_gpt.py cannot start.
    """

    name: str
    summary: str = ""
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_tp_comm: bool = False
    overlap_depth_comm: bool = False
    zero2_grad_reduce: GradReduceTiming = "per_step"
    zero3_gather: Literal["layer", "tensor"] = "layer"
    flash_attention: bool = True
    flash_kernel: FlashKernel = "native"
    selective_recompute: SelectiveKind = "attention-core"
    full_recompute_repeats_layer: bool = True
    host_us_per_block: float | None = None
    host_exposed_fraction: float = 0.0
    host_scale: float = 1.0
    host_split_axis_costs: tuple[float, float, float] = (0.0, 0.0, 0.0)
    split_axis_memory_passes: float = 0.0
    p2p_scatter_gather: bool = False
    weight_bytes: float = 2.0
    master_bytes: float = 4.0
    grad_bytes_bf16: float = 4.0
    grad_bytes_fp16: float = 2.0
    fp32_grad_bytes_bf16: float = 0.0
    zero2_grad_bytes: float | None = None
    zero2_master_bytes: float | None = None
    optimizer_state_bytes: float = 8.0
    fp8_weight_cache_bytes: float = 2.0
    fp8_saves_fp8_inputs: bool = True
    moe_gates_in_experts: bool = False
    grouped_linear_host_ops_per_expert: float = 0.0
    grouped_linear_fp8_host_ops_per_expert: float = 0.0
    context_gib: float = 0.9
    comm_buffer_gib: float = 0.15
    fragmentation: float = 0.05
    optimizer_step_bytes: float = 30.0
    elementwise_bytes_scale: float = 1.0
    loss_bytes_per_logit: float | None = None
    loss_parallel_bytes_per_logit: float | None = None
    sp_saves_gathered_inputs: bool = False
    torch_compile: TorchCompile = "none"
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b")
    zero_stages: tuple[int, ...] = (0, 1)
    tensor_parallel: bool = True
    pipeline_parallel: bool = True
    tensor_parallel_3d: bool = False
    sequence_parallel: bool = True
    vocab_parallel_embedding: bool = True
    context_parallel: bool = False
    expert_parallel: bool = False
    overlap_ep_comm: bool = False
    # what the launcher accepts (see the docstring; perfmodels/launchable.py)
    tp_splits_query_groups: bool = True
    pipeline_layer_split: PipelineSplit = "any"
    pipeline_max_zero_stage: int = 3
    launch_zero_stages: tuple[int, ...] | None = None
    launch_placements: tuple[tuple[str, ...], ...] | None = None
    launch_recomputes: tuple[str, ...] | None = None
    launch_tp_with_pp: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"stack.name must be a non-empty string, got {self.name!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"stack.{f.name} must be true or false, got {value!r}")
        for name in ("zero2_grad_bytes", "zero2_master_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 <= value <= 64.0):
                raise ValueError(f"stack.{name} must be null or a number in [0, 64], got {value!r}")
        if self.zero2_grad_reduce not in ("per_step", "per_microbatch"):
            raise ValueError(f"stack.zero2_grad_reduce must be 'per_step' or 'per_microbatch', "
                             f"got {self.zero2_grad_reduce!r}")
        if self.flash_kernel not in FLASH_KERNEL_VALUES:
            raise ValueError(
                f"stack.flash_kernel must be one of {list(FLASH_KERNEL_VALUES)}, got {self.flash_kernel!r}")
        if self.torch_compile not in TORCH_COMPILE_VALUES:
            raise ValueError(f"stack.torch_compile must be one of {list(TORCH_COMPILE_VALUES)}, "
                             f"got {self.torch_compile!r}")
        if self.zero3_gather not in ("layer", "tensor"):
            raise ValueError(f"stack.zero3_gather must be 'layer' or 'tensor', got {self.zero3_gather!r}")
        if self.selective_recompute not in ("attention-core", "per-op"):
            raise ValueError(f"stack.selective_recompute must be 'attention-core' or 'per-op', "
                             f"got {self.selective_recompute!r}")
        if not 0.0 <= self.host_exposed_fraction <= 1.0:
            raise ValueError(
                f"stack.host_exposed_fraction must be in [0, 1], got {self.host_exposed_fraction!r}"
            )
        object.__setattr__(self, "schedules", tuple(self.schedules))
        object.__setattr__(self, "host_split_axis_costs", tuple(float(x) for x in self.host_split_axis_costs))
        if len(self.host_split_axis_costs) != 3 or any(not 0 <= x <= 10 for x in self.host_split_axis_costs):
            raise ValueError(
                f"stack.host_split_axis_costs must be three numbers in [0, 10] (row, col, depth), "
                f"got {self.host_split_axis_costs!r}"
            )
        if (
            not isinstance(self.optimizer_step_bytes, (int, float))
            or not 0 <= self.optimizer_step_bytes <= 1000
        ):
            raise ValueError(
                f"stack.optimizer_step_bytes must be in [0, 1000], got {self.optimizer_step_bytes!r}"
            )
        for name in ("loss_bytes_per_logit", "loss_parallel_bytes_per_logit"):
            loss_b = getattr(self, name)
            if loss_b is not None and (isinstance(loss_b, bool) or not isinstance(loss_b, (int, float))
                                       or not 0.0 <= loss_b <= 64.0):
                raise ValueError(f"stack.{name} must be null or a number in [0, 64], got {loss_b!r}")
        for name in ("host_scale", "split_axis_memory_passes", "elementwise_bytes_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
                raise ValueError(f"stack.{name} must be a number in [0, 10], got {value!r}")
        object.__setattr__(self, "zero_stages", tuple(self.zero_stages))
        if self.pipeline_layer_split not in PIPELINE_SPLIT_VALUES:
            raise ValueError(f"stack.pipeline_layer_split must be one of {list(PIPELINE_SPLIT_VALUES)}, "
                             f"got {self.pipeline_layer_split!r}")
        if isinstance(self.pipeline_max_zero_stage, bool) or self.pipeline_max_zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"stack.pipeline_max_zero_stage must be 0, 1, 2 or 3, got "
                             f"{self.pipeline_max_zero_stage!r}")
        if self.launch_placements is not None:
            object.__setattr__(self, "launch_placements", tuple(tuple(p) for p in self.launch_placements))
            known = {"col", "row", "depth", "inter", "data", "cp"}
            if not self.launch_placements or any(not set(p) <= known or len(set(p)) != len(p)
                                                 for p in self.launch_placements):
                raise ValueError(f"stack.launch_placements must be orders of {sorted(known)}, "
                                 f"got {self.launch_placements!r}")
        if self.launch_recomputes is not None:
            object.__setattr__(self, "launch_recomputes", tuple(self.launch_recomputes))
            if not self.launch_recomputes or not set(self.launch_recomputes) <= {"none", "selective", "full"}:
                raise ValueError(f"stack.launch_recomputes must be some of none, selective, full, "
                                 f"got {self.launch_recomputes!r}")
        if self.launch_zero_stages is not None:
            object.__setattr__(self, "launch_zero_stages", tuple(self.launch_zero_stages))
            if not self.launch_zero_stages or any(z not in self.zero_stages for z in self.launch_zero_stages):
                raise ValueError(f"stack.launch_zero_stages must be some of zero_stages="
                                 f"{list(self.zero_stages)}, got {self.launch_zero_stages!r}")
        bad = [x for x in self.schedules if x not in ("gpipe", "1f1b", "interleaved-1f1b")]
        if bad or not self.schedules:
            raise ValueError(
                f"stack.schedules must name some of gpipe, 1f1b, interleaved-1f1b, got {self.schedules!r}"
            )
        if not self.zero_stages or any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise ValueError(f"stack.zero_stages must be some of 0, 1, 2, 3, got {self.zero_stages!r}")
        if self.host_us_per_block is not None and not 0.0 <= self.host_us_per_block <= 1e6:
            raise ValueError(
                f"stack.host_us_per_block must be in [0, 1e6] us, got {self.host_us_per_block!r}"
            )
        for name in (
            "weight_bytes",
            "master_bytes",
            "grad_bytes_bf16",
            "grad_bytes_fp16",
            "fp32_grad_bytes_bf16",
            "optimizer_state_bytes",
            "fp8_weight_cache_bytes",
            "context_gib",
            "comm_buffer_gib",
            "fragmentation",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 64.0:
                raise ValueError(f"stack.{name} must be a number in [0, 64], got {value!r}")

    @property
    def fused_elementwise_bytes_scale(self) -> float:
        """Element-wise HBM bytes relative to a fused block: 1 once torch.compile fuses the blocks."""
        return 1.0 if self.torch_compile != "none" else self.elementwise_bytes_scale

    def loss_bytes(self, activation_bytes: float, vocab_split: np.ndarray) -> np.ndarray:
        """Bytes per logit at the loss's peak, for `activation_bytes`-byte logits, per plan
        (`vocab_split`: the tensor-parallel ranks split the vocabulary)."""
        if self.torch_compile == "blocks+loss":
            return np.full(np.shape(vocab_split), COMPILED_LOSS_BYTES_PER_LOGIT)
        plain = self.loss_bytes_per_logit if self.loss_bytes_per_logit is not None else activation_bytes + 4.0
        split = self.loss_parallel_bytes_per_logit
        return np.where(vocab_split, plain if split is None else split, plain)

    def grad_bytes(self, dtype: str) -> float:
        """Bytes per parameter of the gradient buffer for a training dtype."""
        if dtype in ("fp32", "tf32"):
            return 4.0
        return self.grad_bytes_fp16 if dtype == "fp16" else self.grad_bytes_bf16


_MEGATRON = dict(weight_bytes=2.0, master_bytes=4.0, grad_bytes_bf16=4.0, grad_bytes_fp16=2.0,
                 p2p_scatter_gather=True, zero2_grad_reduce="per_step", selective_recompute="attention-core",
                 pipeline_layer_split="megatron", launch_placements=(
                     ("col", "row", "depth", "inter", "data"), ("col", "row", "depth", "data", "inter")))
_PIPE_OUTERMOST = (("col", "row", "depth", "data", "inter"),)
# DeepSpeed ZeRO-3 fetches parameters per submodule that owns them (each Linear, norm, embedding),
# from the module's pre-forward/pre-backward hooks: one gather per parameter tensor, not per block
_DEEPSPEED = dict(weight_bytes=2.0, master_bytes=4.0, grad_bytes_bf16=2.0, grad_bytes_fp16=2.0,
                  fp32_grad_bytes_bf16=4.0, zero2_grad_reduce="per_microbatch", zero3_gather="tensor",
                  # DeepSpeed-MoE runs its local experts one module call at a time (`Experts.forward`
                  # loops over `self.deepspeed_experts`, deepspeed/moe/experts.py at
                  # microsoft/DeepSpeed 0e4271ad): a Linear launch per expert and projection
                  grouped_linear_host_ops_per_expert=1.0)
# FP8 under FSDP (torchao's float8 linears in torchtitan, Transformer Engine linears in LLM Foundry)
# casts the gathered weights per use and keeps no FP8 copy between micro-batches
_FSDP = dict(weight_bytes=4.0, master_bytes=0.0, grad_bytes_bf16=4.0, grad_bytes_fp16=4.0,
             zero2_grad_reduce="per_microbatch", overlap_grad_reduce=True, overlap_param_gather=True,
             fp8_weight_cache_bytes=0.0)

_MEGATRON_CORE = Stack(
    name="megatron-core",
    summary="Megatron-Core / NeMo with Transformer Engine: flash attention, "
    "distributed optimizer reducing once per step behind the last backward, overlapped gathers",
    overlap_grad_reduce=True,
    overlap_param_gather=True,
    flash_attention=True,
    zero2_grad_bytes=2.0,
    zero2_master_bytes=2.0,
    zero_stages=(0, 1, 2),
    context_parallel=True,
    expert_parallel=True,
    overlap_ep_comm=True,
    moe_gates_in_experts=True,
    grouped_linear_host_ops_per_expert=1.0,
    grouped_linear_fp8_host_ops_per_expert=3.0,
    # Megatron-LM's pretrain_gpt.py shards the optimizer (--use-distributed-optimizer) and nothing else
    launch_zero_stages=(0, 1),
    # and cuts the layers with a custom layout where neither an even nor a first/last split works
    # (`rules.megatron_layout_split`)
    **{**_MEGATRON, "pipeline_layer_split": "megatron-core"},
)
"""Megatron-Core as Megatron-LM runs it; the `nemo` preset is this with NeMo's bf16 gradients."""

STACK_PRESETS: dict[str, Stack] = {
    s.name: s
    for s in (
        Stack(
            name="megatron-lm",
            summary="Megatron-LM 2019-22: unfused attention, local DDP reducing after "
            "backward, no distributed optimizer, scatter-gather pipeline sends",
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            flash_attention=False,
            zero_stages=(0,),
            **_MEGATRON,
        ),
        _MEGATRON_CORE,
        replace(
            _MEGATRON_CORE,
            name="nemo",
            summary="NeMo's performance recipes on Megatron-Core: as megatron-core, with gradients "
            "accumulated and reduced in bf16 (NeMo 1.x optim.grad_sync_dtype: bf16; NeMo 2 / "
            "Megatron-Bridge performance overrides grad_reduce_in_fp32=False)",
            grad_bytes_bf16=2.0,
            # ZeRO-3: Megatron FSDP (`use_megatron_fsdp`, sharding strategy optim_grads_params),
            # which NeMo's 2025 recipes use where it is faster
            zero_stages=(0, 1, 2, 3),
            # NeMo 2 / Megatron-Bridge: the distributed optimizer or Megatron FSDP (no Apex DFA)
            launch_zero_stages=(0, 1, 3),
            # Megatron's default order (data inside pipeline; dist.use_tp_pp_dp_mapping is off by default
            # and Megatron-Bridge asserts it off with Megatron FSDP: src/megatron/bridge/training/
            # config.py:1124 at NVIDIA-NeMo/Megatron-Bridge 067f987d)
            launch_placements=(("col", "row", "depth", "data", "inter"),),
        ),
        # host_exposed_fraction stays 0: an additive host cost (0.5) improved vTrain's 3.6B group (10.3% ->
        # 7.3%) but worsened its 39.1B ranking (0.60 -> 0.53) and the single-node runs (+32% on 4 GPUs),
        # so the data do not support it for this stack
        Stack(
            name="megatron-deepspeed",
            summary="Megatron-DeepSpeed: Megatron layers on the DeepSpeed "
            "engine (BF16/FP16 optimizer, pipeline engine reducing gradients after the schedule)",
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            flash_attention=False,
            p2p_scatter_gather=True,
            schedules=("1f1b",),
            zero_stages=(0, 1, 2, 3),
            sequence_parallel=False,
            pipeline_max_zero_stage=1,
            launch_placements=_PIPE_OUTERMOST,
            **_DEEPSPEED,
        ),
        Stack(
            name="deepspeed",
            summary="DeepSpeed ZeRO 1-3 (bucketed reduction overlapped with backward, "
            "ZeRO-2 reducing every micro-batch, ZeRO-3 prefetching parameters)",
            overlap_grad_reduce=True,
            overlap_param_gather=True,
            flash_attention=False,
            schedules=("1f1b",),
            zero_stages=(0, 1, 2, 3),
            sequence_parallel=False,
            # DeepSpeed-MoE: experts over `ep_size` ranks with all-to-all dispatch
            expert_parallel=True,
            pipeline_max_zero_stage=1,
            launch_tp_with_pp=False,
            launch_recomputes=("none", "full"),
            launch_placements=_PIPE_OUTERMOST,
            **_DEEPSPEED,
        ),
        Stack(
            name="fsdp",
            summary="PyTorch FSDP1 as LLM Foundry / Composer run it: fp32 flat parameters "
            "sharded, bf16 compute, prefetching, gradients reduce-scattered per micro-batch, MPT's "
            "Triton flash attention (an Ampere kernel)",
            flash_attention=True,
            flash_kernel="pre-hopper",
            zero_stages=(0, 2, 3),
            tensor_parallel=False,
            pipeline_parallel=False,
            sequence_parallel=False,
            full_recompute_repeats_layer=False,
            launch_recomputes=("none", "full"),
            **_FSDP,
        ),
        Stack(
            name="torchtitan",
            summary="torchtitan: FSDP2 + tensor/pipeline parallelism, per-op selective "
            "activation checkpointing",
            flash_attention=True,
            selective_recompute="per-op",
            # ptd_checkpoint_wrapper with torch's early stop, as until 2025-08-29 (Stack docstring)
            full_recompute_repeats_layer=False,
            fp8_saves_fp8_inputs=False,
            elementwise_bytes_scale=TORCHTITAN_EAGER_ELEMENTWISE,
            loss_bytes_per_logit=EAGER_LOSS_BYTES_PER_LOGIT,
            loss_parallel_bytes_per_logit=LOSS_PARALLEL_BYTES_PER_LOGIT,
            sp_saves_gathered_inputs=True,
            schedules=("gpipe", "1f1b", "interleaved-1f1b"),
            zero_stages=(0, 2, 3),
            # torchtitan's `parallelism.context_parallel_degree` (ring attention over SDPA) and
            # `expert_parallel_degree` (all-to-all token dispatch)
            context_parallel=True,
            expert_parallel=True,
            pipeline_layer_split="torchtitan",
            launch_placements=_PIPE_OUTERMOST,
            **_FSDP,
        ),
        Stack(
            name="oneflow",
            summary="OneFlow GPT (2021): Megatron-style layers, whole-activation pipeline "
            "sends, gradient reduction after backward",
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            flash_attention=False,
            p2p_scatter_gather=False,
            weight_bytes=2.0,
            master_bytes=4.0,
            grad_bytes_bf16=4.0,
            grad_bytes_fp16=2.0,
            schedules=("gpipe", "1f1b"),
            zero_stages=(0,),
            sequence_parallel=False,
        ),
        Stack(
            name="gridtune",
            summary="gridtune's own engine: fp32 parameters under autocast, PyTorch SDPA, "
            "data-parallel all-reduce in buckets overlapped with the last micro-batch's backward, "
            "ZeRO 1-2 (ZeRO-2 reducing once per step; engine.Zero3 is not offered to the search yet), "
            "synchronous tensor-parallel collectives, depth all-gathers prefetched one layer ahead",
            overlap_grad_reduce=True,
            overlap_param_gather=False,
            overlap_tp_comm=False,
            # engine.linear: each depth-sharded layer prefetches the next layer's weight all-gather
            # (forward) and the previous one's (backward) with async_op=True, and runs its weight-grad
            # reduce-scatter behind the input-grad GEMM (engine.prefetch_depth, on via engine.wrap)
            overlap_depth_comm=True,
            flash_attention=True,
            weight_bytes=4.0,
            master_bytes=0.0,
            grad_bytes_bf16=4.0,
            grad_bytes_fp16=4.0,
            schedules=("gpipe", "1f1b", "interleaved-1f1b"),
            zero_stages=(0, 1, 2),
            tensor_parallel_3d=True,
            sequence_parallel=False,
            vocab_parallel_embedding=False,
            # the engine's ring attention over "cp" and all-to-all expert dispatch over "ep"
            # (docs/architecture.md, the byte contract of perfmodels.traffic)
            context_parallel=True,
            expert_parallel=True,
            # engine.parallel_gpt replicates a key/value group on the row ranks that share it
            tp_splits_query_groups=False,
            # engine.train recomputes whole blocks of the built-in GPT or nothing (engine_limits),
            # through non-reentrant torch.utils.checkpoint with its early stop
            full_recompute_repeats_layer=False,
            launch_recomputes=("none", "full"),
            # measured on one H100 by scripts/gpu_check.sh (bench/gpu_check.py, 12 layouts of a 4x4096
            # GPT with the fake process group): the host issues a block's forward in ~0.6 ms
            # unsharded, +20% with row, +60% with col, +30% with depth split; each split axis
            # doubles the block's element-wise traffic (layout conversions, split norms);
            # torch.optim.AdamW (foreach) streams ~94 bytes per parameter
            host_scale=2.0 / 3.0,
            host_split_axis_costs=(0.2, 0.6, 0.3),
            # engine.moe runs its local experts in a Python loop (select the rows, fc1, GELU, fc2,
            # index_add per expert): a GEMM launch per expert and projection
            grouped_linear_host_ops_per_expert=1.0,
            split_axis_memory_passes=1.0,
            optimizer_step_bytes=94.0,
        ),
    )
}
"""The presets, by name. `perfmodels.stacks.preset(name, **overrides)` builds one with changes."""

DEFAULT_STACK = "gridtune"


def can_run(stack: Stack, *, G_inter: np.ndarray, G_intra_r: np.ndarray, G_intra_c: np.ndarray,
            G_intra_d: np.ndarray, schedule_names: np.ndarray, zero_stage: np.ndarray,
            sequence_parallel: np.ndarray) -> np.ndarray:
    """Which plans (arrays of their fields; schedules by name) this stack can run."""
    ok = np.isin(schedule_names, stack.schedules) | (G_inter == 1)
    ok &= np.isin(zero_stage, stack.zero_stages)
    ok &= stack.tensor_parallel | (G_intra_r == 1)
    ok &= stack.tensor_parallel_3d | ((G_intra_c == 1) & (G_intra_d == 1))
    ok &= stack.pipeline_parallel | (G_inter == 1)
    ok &= stack.sequence_parallel | ~np.asarray(sequence_parallel, bool)
    return ok


def can_run_context_expert(stack: Stack, *, G_cp: np.ndarray, G_ep: np.ndarray,
                           expert_tp: np.ndarray) -> np.ndarray:
    """Which plans this stack runs as far as context parallelism (G_cp) and expert parallelism
    (G_ep, and expert tensor parallelism `expert_tp`, G_etp resolved) go: `Stack.context_parallel`,
    `Stack.expert_parallel`."""
    ok = np.asarray(stack.context_parallel | (np.asarray(G_cp) == 1))
    return ok & (stack.expert_parallel | ((np.asarray(G_ep) == 1) & (np.asarray(expert_tp) == 1)))


def preset(name: str, **overrides: object) -> Stack:
    """The named preset, with `overrides` (Stack field names) applied; ValueError names what is wrong."""
    if name not in STACK_PRESETS:
        raise ValueError(f"training.stack must be one of {sorted(STACK_PRESETS)}, got {name!r}")
    known = {f.name for f in fields(Stack)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown stack option(s) {unknown}; known: {sorted(known - {'name', 'summary'})}")
    return replace(STACK_PRESETS[name], **overrides) if overrides else STACK_PRESETS[name]


def resolve(stack: str | Stack) -> Stack:
    """A Stack from a preset name or a Stack."""
    if isinstance(stack, Stack):
        return stack
    if isinstance(stack, str):
        return preset(stack)
    raise ValueError(f"training.stack must be a preset name or a Stack, got {stack!r}")
