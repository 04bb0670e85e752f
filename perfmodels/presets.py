"""Named GPUs, clusters and models, from vendor data sheets and the papers that trained them.

`gemm_efficiency_max` is what the GEMMs of a training step sustain, not the best square-GEMM
microbenchmark: an 8192^3 bf16 GEMM reaches ~800 TFLOP/s on an H100, but the GEMM mix of a
training step (epilogues, smaller tiles, clocks under sustained power) runs nearer 0.62 of peak on
Hopper (`HOPPER_GEMM`) and 0.80 on Ampere (0.85 left every published Selene/DGX-A100 run of
Megatron 7-18% slower than predicted); a measured profile (`gridtune profile`) replaces these defaults.

Peak numbers are dense (no sparsity). Bandwidths are per GPU per direction in GB/s: NVLink/xGMI
for `intra`, the node's network bandwidth divided by its GPUs for `inter`. Look-ups are
case-insensitive and accept `_` for `-`; unknown names raise `ValueError` listing the known ones.
"""

from __future__ import annotations

from dataclasses import replace

from perfmodels.specs import GPU, Cluster, CollectiveFit, Model, Profile

# --------------------------------------------------------------------------------------------
# GPUs (dense peak TFLOP/s; memory as sold; HBM bandwidth GB/s)
# --------------------------------------------------------------------------------------------

HOPPER_GEMM = 0.62
"""Sustained fraction of the bf16 dense peak that a Hopper training step's GEMMs reach. Isolated GEMMs
at training shapes measure 0.68-0.70 on one H100 SXM (`bench/hopper_kernels.py`: 0.691 median over
eight shapes from 2048x9216x12288 to 8192^3, at the full 1980 MHz clock). In a training step the
NCCL kernels that overlap them take SMs and eight GPUs share a node's power, and every published H100
run of Megatron-Core and NeMo (README 2024 weak scaling, dgxc-benchmarking 24.x) came out 10-20%
slower than 0.70 predicts."""
HOPPER_FP8_GEMM = 0.50
"""Sustained fraction of the FP8 peak for Transformer Engine's FP8 GEMMs in training. Isolated FP8
GEMMs (`torch._scaled_mm`, per-tensor scales) measure 0.61 on one H100 (`bench/hopper_kernels.py`);
the same in-step losses as bf16 bring that to ~0.5, which is what NVIDIA's NeMo FP8 recipes show
(1.3-1.5x over bf16 end to end, not 2x)."""
BLACKWELL_GEMM = 0.70
"""Sustained fraction of the bf16 dense peak of Blackwell (B200, GB200) training GEMMs (no measurement
of ours yet: `gridtune profile` on the card replaces it)."""
BLACKWELL_FP8_GEMM = BLACKWELL_GEMM * HOPPER_FP8_GEMM / HOPPER_GEMM
"""FP8 GEMMs of Transformer Engine keep a smaller share of their (twice as high) peak than bf16 ones:
the ratio measured on Hopper (0.50 / 0.62) applied to Blackwell's bf16 share, about 0.56."""
HOPPER_FLASH = {"flash_fwd_efficiency": 0.45, "flash_bwd_efficiency": 0.40}
"""Fused causal attention on Hopper (PyTorch SDPA, head dim 128), measured by `bench/hopper_kernels.py`
on an H100: forward 0.42-0.55 of the bf16 peak (median 0.465), backward 0.34-0.49 (median 0.40; it
recomputes the scores and accumulates dQ atomically)."""

_GPUS: dict[str, GPU] = {
    g.name.lower(): g
    for g in (
        GPU(name="V100-16GB", peak_tflops_fp32=15.7, peak_tflops_tf32=0.0, peak_tflops_bf16=15.7,
            peak_tflops_fp16=125.0, memory_gib=16.0, hbm_bandwidth_GBps=900.0, gemm_efficiency_max=0.80),
        GPU(name="V100-32GB", peak_tflops_fp32=15.7, peak_tflops_tf32=0.0, peak_tflops_bf16=15.7,
            peak_tflops_fp16=125.0, memory_gib=32.0, hbm_bandwidth_GBps=900.0, gemm_efficiency_max=0.80),
        GPU(name="A100-40GB", peak_tflops_fp32=19.5, peak_tflops_tf32=156.0, peak_tflops_bf16=312.0,
            peak_tflops_fp16=312.0, memory_gib=40.0, hbm_bandwidth_GBps=1555.0, gemm_efficiency_max=0.80),
        GPU(name="A100-80GB", peak_tflops_fp32=19.5, peak_tflops_tf32=156.0, peak_tflops_bf16=312.0,
            peak_tflops_fp16=312.0, memory_gib=80.0, hbm_bandwidth_GBps=2039.0, gemm_efficiency_max=0.80),
        GPU(name="H100-SXM", peak_tflops_fp32=67.0, peak_tflops_tf32=494.5, peak_tflops_bf16=989.0,
            peak_tflops_fp16=989.0, peak_tflops_fp8=1979.0, memory_gib=80.0, hbm_bandwidth_GBps=3350.0,
            gemm_efficiency_max=HOPPER_GEMM, gemm_efficiency_fp8=HOPPER_FP8_GEMM, **HOPPER_FLASH),
        GPU(name="H100-PCIe", peak_tflops_fp32=51.0, peak_tflops_tf32=378.0, peak_tflops_bf16=756.0,
            peak_tflops_fp16=756.0, peak_tflops_fp8=1513.0, memory_gib=80.0, hbm_bandwidth_GBps=2000.0,
            gemm_efficiency_max=HOPPER_GEMM, gemm_efficiency_fp8=HOPPER_FP8_GEMM, **HOPPER_FLASH),
        # The 96 GB HBM2e SXM variant (e.g. Meta's Grand Teton hosts, run at a 500 W default power limit):
        # 2.4 TB/s, and the power cap lowers tensor-core clocks; its users (torchtitan's 2024 benchmarks)
        # place its real peak "between SXM and NVL" (989 and 835 TFLOP/s), so the midpoint is taken.
        # (Its users' runs looked ~10% slower than the midpoint until their attention kernel was stated:
        # SDPA ran FlashAttention-2 there, `Stack.flash_kernel`; they now sit within -4..+3%.)
        GPU(name="H100-96GB", peak_tflops_fp32=61.0, peak_tflops_tf32=456.0, peak_tflops_bf16=912.0,
            peak_tflops_fp16=912.0, peak_tflops_fp8=1824.0, memory_gib=96.0, hbm_bandwidth_GBps=2400.0,
            gemm_efficiency_max=HOPPER_GEMM, gemm_efficiency_fp8=HOPPER_FP8_GEMM, **HOPPER_FLASH),
        GPU(name="H200", peak_tflops_fp32=67.0, peak_tflops_tf32=494.5, peak_tflops_bf16=989.0,
            peak_tflops_fp16=989.0, peak_tflops_fp8=1979.0, memory_gib=141.0, hbm_bandwidth_GBps=4800.0,
            gemm_efficiency_max=HOPPER_GEMM, gemm_efficiency_fp8=HOPPER_FP8_GEMM, **HOPPER_FLASH),
        GPU(name="GH200", peak_tflops_fp32=67.0, peak_tflops_tf32=494.5, peak_tflops_bf16=989.0,
            peak_tflops_fp16=989.0, peak_tflops_fp8=1979.0, memory_gib=96.0, hbm_bandwidth_GBps=4000.0,
            gemm_efficiency_max=HOPPER_GEMM, gemm_efficiency_fp8=HOPPER_FP8_GEMM, **HOPPER_FLASH),
        GPU(name="MI250X-GCD", peak_tflops_fp32=47.9, peak_tflops_tf32=0.0, peak_tflops_bf16=191.5,
            peak_tflops_fp16=191.5, memory_gib=64.0, hbm_bandwidth_GBps=1638.0, gemm_efficiency_max=0.70,
            vendor="amd"),
        GPU(name="MI300X", peak_tflops_fp32=163.4, peak_tflops_tf32=653.7, peak_tflops_bf16=1307.0,
            peak_tflops_fp16=1307.0, peak_tflops_fp8=2615.0, memory_gib=192.0, hbm_bandwidth_GBps=5300.0,
            gemm_efficiency_max=0.65, vendor="amd"),
        GPU(name="B200", peak_tflops_fp32=80.0, peak_tflops_tf32=1100.0, peak_tflops_bf16=2250.0,
            peak_tflops_fp16=2250.0, peak_tflops_fp8=4500.0, memory_gib=180.0, hbm_bandwidth_GBps=8000.0,
            gemm_efficiency_max=BLACKWELL_GEMM, gemm_efficiency_fp8=BLACKWELL_FP8_GEMM),
        # Grace-Blackwell GB200 (NVL72 racks): the B200 die at up to 1,200 W, 2.5 PFLOP/s dense bf16,
        # 5 dense fp8, 186 GB HBM3e at 8 TB/s; 72 GPUs share one NVLink domain (900 GB/s per direction)
        GPU(name="GB200", peak_tflops_fp32=80.0, peak_tflops_tf32=1250.0, peak_tflops_bf16=2500.0,
            peak_tflops_fp16=2500.0, peak_tflops_fp8=5000.0, memory_gib=186.0, hbm_bandwidth_GBps=8000.0,
            gemm_efficiency_max=BLACKWELL_GEMM, gemm_efficiency_fp8=BLACKWELL_FP8_GEMM),
        # China-market Hopper (compute cut to 148 TFLOP/s, full HBM3 and NVLink).
        GPU(name="H20", peak_tflops_fp32=44.0, peak_tflops_tf32=74.0, peak_tflops_bf16=148.0,
            peak_tflops_fp16=148.0, peak_tflops_fp8=296.0, memory_gib=96.0, hbm_bandwidth_GBps=4000.0,
            gemm_efficiency_max=0.80),
        # Ada PCIe cards (GDDR6, no NVLink).
        GPU(name="L40S", peak_tflops_fp32=91.6, peak_tflops_tf32=183.0, peak_tflops_bf16=362.0,
            peak_tflops_fp16=362.0, peak_tflops_fp8=733.0, memory_gib=48.0, hbm_bandwidth_GBps=864.0,
            gemm_efficiency_max=0.70),
        GPU(name="MI210", peak_tflops_fp32=22.6, peak_tflops_tf32=0.0, peak_tflops_bf16=181.0,
            peak_tflops_fp16=181.0, memory_gib=64.0, hbm_bandwidth_GBps=1638.0, gemm_efficiency_max=0.70,
            vendor="amd"),
        # A CPU "device" for the local closed loop: numbers of the order of this 2-core machine;
        # `gridtune profile` replaces them with measured ones. memory_gib is the host's memory: the
        # ranks on one node share it (perfmodels.memory.capacity_per_rank_gib).
        GPU(name="cpu", peak_tflops_fp32=0.1, peak_tflops_tf32=0.0, peak_tflops_bf16=0.05,
            peak_tflops_fp16=0.05, memory_gib=24.0, hbm_bandwidth_GBps=20.0, gemm_efficiency_max=0.6,
            memory_efficiency=0.5, vendor="cpu"),
    )
}
_GPU_ALIASES = {
    "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb", "h100": "h100-sxm",
    "h100-80gb": "h100-sxm", "v100": "v100-32gb", "mi250x": "mi250x-gcd", "mi250x-gcd": "mi250x-gcd",
    "mi300": "mi300x",
}


def unknown_name(kind: str, name: str, known: list[str]) -> ValueError:
    """The error for an unknown preset name: the closest known names first ("did you mean"), then
    all of them (difflib's similarity ratio, case-insensitive)."""
    import difflib

    lowered = {k.lower(): k for k in known}
    close = [lowered[m] for m in difflib.get_close_matches(_key(name), list(lowered), n=3, cutoff=0.6)]
    quoted = [repr(c) for c in close]
    listed = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    hint = f"; did you mean {listed}?" if close else ""
    return ValueError(f"unknown {kind} preset {name!r}{hint} (known: {', '.join(sorted(known))})")


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-").replace(" ", "-")


def gpu(name: str) -> GPU:
    key = _key(name)
    key = _GPU_ALIASES.get(key, key)
    if key not in _GPUS:
        raise unknown_name("GPU", name, gpu_names())
    return _GPUS[key]


def gpu_names() -> list[str]:
    return sorted(g.name for g in _GPUS.values())


# --------------------------------------------------------------------------------------------
# Clusters (num_gpus is a default; callers replace it with the size they plan for)
# --------------------------------------------------------------------------------------------

VTRAIN_A100_ALL_REDUCE: tuple[tuple[int, float, float], ...] = (
    (2, 23.7, 193.1), (3, 14.0, 209.7), (4, 14.6, 219.0), (5, 10.4, 222.6), (6, 11.8, 224.9),
    (7, 12.4, 226.6), (8, 13.6, 227.7),
)
"""(GPUs, alpha us, bus GB/s) of NCCL all-reduce inside one node of the vTrain paper's A100 cluster: the
nccl-tests tables the vTrain repository ships with its simulator (VIA-Research/vTrain f8dda84,
trace/a100/AR_GPU{2..8}_1M_1024M_LUT: all_reduce_perf, fp32, 1 MiB to 1 GiB in 1 MiB steps, 1,024
sizes each), fitted by `perfmodels.fitting.fit_alpha_beta` on the out-of-place times (r2 >= 0.998).
The simulator costs its tensor-parallel all-reduces from these same tables; its configs' 150 GB/s is
only used for groups larger than a node."""


def _vtrain_a100_profile() -> Profile:
    return Profile(profile_id="vtrain-a100-nccl-tests", collectives=tuple(
        CollectiveFit(op="all_reduce", level="intra", group_size=g, alpha_us=alpha, busbw_GBps=bw)
        for g, alpha, bw in VTRAIN_A100_ALL_REDUCE))


def _cluster(name: str, gpu_name: str, gpus_per_node: int, intra: float, inter: float, num_gpus: int,
             **extra: object) -> Cluster:
    return Cluster(name=name, num_gpus=num_gpus, gpus_per_node=gpus_per_node, gpu=gpu(gpu_name),
                   intra_node_bandwidth_GBps=intra, inter_node_bandwidth_GBps=inter, **extra)  # type: ignore[arg-type]


_CLUSTERS: dict[str, Cluster] = {
    c.name: c
    for c in (
        # NVIDIA Selene: DGX A100 (8x A100-80GB, NVLink3 300 GB/s per direction, 8x HDR 200 Gb/s).
        _cluster("selene", "A100-80GB", 8, 300.0, 25.0, 4480),
        # NVIDIA Eos: DGX H100 (8x H100, NVLink4 450 GB/s per direction, 8x NDR 400 Gb/s).
        _cluster("eos", "H100-SXM", 8, 450.0, 50.0, 4608),
        # NERSC Perlmutter GPU nodes: 4x A100-40GB, NVLink3, 4x Slingshot-11 (25 GB/s each).
        _cluster("perlmutter", "A100-40GB", 4, 300.0, 25.0, 6144),
        # OLCF Frontier: 4x MI250X = 8 GCDs per node, Infinity Fabric, 4x Slingshot (25 GB/s each).
        _cluster("frontier", "MI250X-GCD", 8, 100.0, 12.5, 75264, backend="rccl"),
        # CSCS Alps: 4x GH200 per node, NVLink4, 4x Slingshot-11 (25 GB/s each).
        _cluster("alps", "GH200", 4, 450.0, 25.0, 10752),
        # The A100 cluster of the vTrain paper (MICRO'24): 8 GPUs per node, NVLink, 800 Gb/s per
        # node of InfiniBand (its configs: intra 150 GB/s, inter 800 Gb/s, node size 8). Its in-node
        # all-reduces are the ones measured there (`VTRAIN_A100_ALL_REDUCE`, 193-228 GB/s bus
        # bandwidth); 150 GB/s at efficiency 1 stays for what those tables do not cover.
        _cluster("vtrain-a100", "A100-80GB", 8, 150.0, 12.5, 512, link_efficiency_intra=1.0,
                 profile=_vtrain_a100_profile()),
        # DGX-2 (16x V100-32GB, NVSwitch 150 GB/s per direction, 8x EDR 100 Gb/s).
        _cluster("dgx2-v100", "V100-32GB", 16, 150.0, 6.25, 512),
        # A DGX-1-like V100-16GB cluster on 100 Gb/s InfiniBand per node (OneFlow DLPerf's).
        _cluster("dgx1-v100", "V100-16GB", 8, 150.0, 1.5625, 32),
        # DGX H200 / B200 nodes on NDR.
        _cluster("dgx-h200", "H200", 8, 450.0, 50.0, 1024),
        _cluster("dgx-b200", "B200", 8, 900.0, 50.0, 1024),
        # GB200 NVL72: one NVLink domain of 72 GPUs per rack, 400 Gb/s InfiniBand per GPU between racks.
        _cluster("gb200-nvl72", "GB200", 72, 900.0, 50.0, 576),
        # Meta's Grand Teton hosts as torchtitan benchmarked them: 8x H100 96 GB HBM2e at 500 W, NVLink,
        # 400 Gb/s RDMA per GPU.
        _cluster("grand-teton", "H100-96GB", 8, 450.0, 50.0, 512),
        _cluster("mi300x-node", "MI300X", 8, 448.0, 50.0, 1024, backend="rccl"),
        # This machine kind: one node, CPU "devices", gloo over shared memory/loopback.
        _cluster("local-cpu", "cpu", 8, 2.0, 2.0, 4, backend="gloo", intra_node_latency_us=100.0,
                 inter_node_latency_us=100.0, link_efficiency_intra=1.0, link_efficiency_inter=1.0),
    )
}


def cluster(name: str, num_gpus: int | None = None) -> Cluster:
    key = _key(name)
    if key not in _CLUSTERS:
        raise unknown_name("cluster", name, cluster_names())
    c = _CLUSTERS[key]
    return c if num_gpus is None else replace(c, num_gpus=num_gpus)


def cluster_names() -> list[str]:
    return sorted(_CLUSTERS)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> Model:
    return Model(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 seq_length=2048, vocab_size=51200)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> Model:
    return Model(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 num_query_groups=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq, gated_mlp=True,
                 dropout=False)


def _moe(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int, *,
         experts: int, topk: int, expert_ffn: int, **extra: object) -> Model:
    """A gated (SwiGLU), RMSNorm, dropout-free mixture-of-experts transformer with untied embeddings."""
    return Model(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 num_query_groups=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq, gated_mlp=True,
                 dropout=False, num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=expert_ffn,
                 **extra)  # type: ignore[arg-type]


# Mixture-of-experts models, dimensions from each model's published Hugging Face config.json
# (the repository named; training sequence 4096, the length of the vendors' published pretraining
# benchmarks, Megatron-Bridge and torchtitan). Megatron-Core's names: `moe_layer_freq` a 0/1 list
# for DeepSeek-V3's and Kimi-K2's leading dense layers (first_k_dense_replace 3 and 1), 2 for Llama 4
# Maverick's alternating layers (interleave_moe_layer_step 2); kv_channels where head_dim is not
# hidden / heads (Qwen3 and GPT-OSS: head_dim 128 and 64).
_MOE_MODELS = (
    # mistralai/Mixtral-8x7B-v0.1, mistralai/Mixtral-8x22B-v0.1
    _moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, topk=2, expert_ffn=14336),
    _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 4096, experts=8, topk=2, expert_ffn=16384),
    # deepseek-ai/DeepSeek-V3: MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
    # qk_rope_head_dim 64, v_head_dim 128), 256 routed experts of 2048 + 1 shared, top-8
    _moe("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096, experts=256, topk=8, expert_ffn=2048,
         moe_shared_expert_intermediate_size=2048, moe_layer_freq=(0,) * 3 + (1,) * 58,
         multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
         qk_pos_emb_head_dim=64, v_head_dim=128),
    # moonshotai/Kimi-K2-Base: DeepSeek-V3's architecture with 384 experts, 64 heads, one dense layer
    _moe("kimi-k2", 61, 7168, 64, 64, 18432, 163840, 4096, experts=384, topk=8, expert_ffn=2048,
         moe_shared_expert_intermediate_size=2048, moe_layer_freq=(0,) + (1,) * 60,
         multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
         qk_pos_emb_head_dim=64, v_head_dim=128),
    # Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B: 128 experts, top-8, no shared expert
    _moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 4096, experts=128, topk=8, expert_ffn=768,
         kv_channels=128),
    _moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 4096, experts=128, topk=8, expert_ffn=1536,
         kv_channels=128),
    # meta-llama/Llama-4-Scout-17B-16E, meta-llama/Llama-4-Maverick-17B-128E: top-1 routed expert
    # of 8192 plus a shared expert of 8192; Maverick's dense layers have an MLP of 16384
    _moe("llama4-scout", 48, 5120, 40, 8, 16384, 202048, 4096, experts=16, topk=1, expert_ffn=8192,
         moe_shared_expert_intermediate_size=8192, kv_channels=128),
    _moe("llama4-maverick", 48, 5120, 40, 8, 16384, 202048, 4096, experts=128, topk=1, expert_ffn=8192,
         moe_shared_expert_intermediate_size=8192, moe_layer_freq=2, kv_channels=128),
    # openai/gpt-oss-20b, openai/gpt-oss-120b: 32 / 128 experts of 2880, top-4, head_dim 64
    _moe("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, 4096, experts=32, topk=4, expert_ffn=2880,
         kv_channels=64),
    _moe("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 4096, experts=128, topk=4, expert_ffn=2880,
         kv_channels=64),
)

_MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        # Megatron-LM SC'21 (Narayanan et al.), Table 1, and GPT-3 175B (Brown et al. 2020).
        _gpt3("gpt3-1.7b", 24, 2304, 24),
        _gpt3("gpt3-3.6b", 30, 3072, 32),
        _gpt3("gpt3-7.5b", 36, 4096, 32),
        _gpt3("gpt3-18b", 40, 6144, 48),
        _gpt3("gpt3-39b", 48, 8192, 64),
        _gpt3("gpt3-76b", 60, 10240, 80),
        _gpt3("gpt3-145b", 80, 12288, 96),
        _gpt3("gpt3-175b", 96, 12288, 96),
        _gpt3("gpt3-310b", 96, 16384, 128),
        _gpt3("gpt3-530b", 105, 20480, 128),
        _gpt3("gpt3-1t", 128, 25600, 160),
        # Llama 2 (Touvron et al. 2023) and Llama 3 (Dubey et al. 2024).
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        # Llama 3.1 (meta-llama/Llama-3.1-8B, -70B, -405B config.json): Llama 3's shapes
        _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        *_MOE_MODELS,
        # BLOOM (BigScience 2022).
        Model(name="bloom-176b", num_layers=70, hidden_size=14336, num_attention_heads=112,
              seq_length=2048, vocab_size=250880, tied_embeddings=True),
        # GPT-2 (Radford et al. 2019).
        Model(name="gpt2-small", num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024,
              vocab_size=50257, tied_embeddings=True),
        Model(name="gpt2-medium", num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024,
              vocab_size=50257, tied_embeddings=True),
        Model(name="gpt2-large", num_layers=36, hidden_size=1280, num_attention_heads=20, seq_length=1024,
              vocab_size=50257, tied_embeddings=True),
        Model(name="gpt2-xl", num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=1024,
              vocab_size=50257, tied_embeddings=True),
        # A model the engine trains in seconds on CPU ranks (local closed loop, tests).
        Model(name="tiny-gpt", num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
              vocab_size=256),
    )
}
_MODEL_ALIASES = {
    "gpt3": "gpt3-175b",
    "gpt-3": "gpt3-175b",
    "llama-3-405b": "llama3-405b",
    "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b",
    "llama-3-70b": "llama3-70b",
    "llama-2-7b": "llama2-7b",
    "llama-2-13b": "llama2-13b",
    "gpt2": "gpt2-small",
    "bloom": "bloom-176b",
}


def model(name: str) -> Model:
    key = _key(name)
    key = _MODEL_ALIASES.get(key, key)
    if key not in _MODELS:
        raise unknown_name("model", name, model_names())
    return _MODELS[key]


def model_names() -> list[str]:
    return sorted(_MODELS)
