"""Feed an emitted launch (`tuner.launch.launch_for`) to the training framework's own code, where that
code runs on a CPU, and to a table of the rules that live only in a launcher script (Megatron-LM's
`megatron/training/arguments.py`), each citing its line. Shared by tests/tuner/test_launch_frameworks.py
and bench/emit_matrix.py; the frameworks come from the `frameworks` extra (pyproject.toml).

    problems = check("megatron", launch, model, cluster, training, plan)   # [] when it passes
    missing("megatron")   # why the check cannot run here (the package is not installed), or None

Sources: NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (arguments.py, the Megatron-LM
training script's own checks), megatron-core 0.16.0 (`TransformerConfig`, `ModelParallelConfig`,
`DistributedDataParallelConfig`, `parallel_state.RankGenerator`), DeepSpeed 0.19.8
(`deepspeed.runtime.config.DeepSpeedConfig`; deepspeed/runtime/pipe/engine.py:77 at edaa7221),
torchtitan 0.3.0 (`ParallelismConfig`, `TrainingConfig`, the activation-checkpoint subcommands parsed
by tyro as its ConfigManager does, `ParallelDims`, `pipeline_parallel._get_pipeline_metadata`).
"""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from perfmodels.specs import Cluster, Model, Plan, Training
from tuner.launch import Launch

PACKAGES = {
    "megatron": "megatron.core",
    "nemo": "megatron.core",
    "deepspeed": "deepspeed",
    "torchtitan": "torchtitan",
    "fsdp": "torch",
    "gridtune": "torch",
}


def missing(kind: str) -> str | None:
    """Why `kind`'s framework check cannot run here, or None."""
    module = PACKAGES[kind]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else f"{module} is not installed (pip install -e '.[frameworks]')"


# ---------------------------------------------------------------------------------------------
# Megatron-LM: the arguments.py rules (checked here) and megatron-core's own classes
# ---------------------------------------------------------------------------------------------


def parse_args(launch: Launch) -> dict[str, Any]:
    """The emitted pretrain_gpt.py arguments as {flag: value or True}, plus "env" (VAR=value prefixes)."""
    out: dict[str, Any] = {}
    for arg in launch.args:
        parts = shlex.split(arg)
        out[parts[0]] = parts[1] if len(parts) > 1 else True
    out["env"] = dict(e.split("=", 1) for e in launch.config.get("env", []))
    return out


@dataclass(frozen=True)
class ArgRule:
    source: str
    what: str
    holds: Callable[[dict[str, Any], int], bool]


def _i(a: dict[str, Any], flag: str, default: int = 1) -> int:
    return int(a.get(flag, default))


MEGATRON_ARG_RULES: tuple[ArgRule, ...] = (
    ArgRule(
        "megatron/core/transformer/attention.py:169 (core_v0.15.3)",
        "--num-query-groups (default: the "
        "heads) is divisible by --tensor-model-parallel-size (releases before 0.16 split whole groups)",
        lambda a, w: (
            _i(a, "--num-query-groups", _i(a, "--num-attention-heads"))
            % _i(a, "--tensor-model-parallel-size")
            == 0
        ),
    ),
    ArgRule(
        "arguments.py:997",
        "without uneven-stage, layout or virtual-stage flags, --num-layers is divisible by "
        "--pipeline-model-parallel-size",
        lambda a, w: (
            "--decoder-first-pipeline-num-layers" in a
            or "--pipeline-model-parallel-layout" in a
            or "--num-layers-per-virtual-pipeline-stage" in a
            or "--num-virtual-stages-per-pipeline-rank" in a
            or _i(a, "--num-layers") % _i(a, "--pipeline-model-parallel-size") == 0
        ),
    ),
    ArgRule(
        "arguments.py:955",
        "--num-layers-per-virtual-pipeline-stage is not combined with the "
        "uneven-stage flags (those take --num-virtual-stages-per-pipeline-rank)",
        lambda a, w: (
            not (
                "--num-layers-per-virtual-pipeline-stage" in a
                and ("--decoder-first-pipeline-num-layers" in a or "--decoder-last-pipeline-num-layers" in a)
            )
        ),
    ),
    ArgRule(
        "arguments.py:968-972",
        "with --num-layers-per-virtual-pipeline-stage, the layers divide by the "
        "pipeline size and the per-stage layers by it",
        lambda a, w: (
            "--num-layers-per-virtual-pipeline-stage" not in a
            or (
                _i(a, "--num-layers") % _i(a, "--pipeline-model-parallel-size") == 0
                and (_i(a, "--num-layers") // _i(a, "--pipeline-model-parallel-size"))
                % _i(a, "--num-layers-per-virtual-pipeline-stage")
                == 0
            )
        ),
    ),
    ArgRule(
        "arguments.py:1001-1009",
        "an interleaved schedule needs --pipeline-model-parallel-size > 1 "
        "(> 2 with --no-overlap-p2p-communication)",
        lambda a, w: (
            not (
                "--num-layers-per-virtual-pipeline-stage" in a
                or "--num-virtual-stages-per-pipeline-rank" in a
            )
            or _i(a, "--pipeline-model-parallel-size") > (2 if "--no-overlap-p2p-communication" in a else 1)
        ),
    ),
    ArgRule(
        "arguments.py:1025-1029",
        "--overlap-param-gather needs --use-distributed-optimizer or "
        "--use-megatron-fsdp, and --overlap-grad-reduce",
        lambda a, w: (
            "--overlap-param-gather" not in a
            or (
                ("--use-distributed-optimizer" in a or "--use-megatron-fsdp" in a)
                and "--overlap-grad-reduce" in a
            )
        ),
    ),
    ArgRule(
        "arguments.py:1165,1170",
        "Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 and --ckpt-format fsdp_dtensor",
        lambda a, w: (
            "--use-megatron-fsdp" not in a
            or (
                a["env"].get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"
                and a.get("--ckpt-format") == "fsdp_dtensor"
            )
        ),
    ),
    ArgRule(
        "arguments.py:1124-1135,3158",
        "Megatron FSDP version 1 (the default) runs with the distributed optimizer; version 2 without it",
        lambda a, w: "--use-megatron-fsdp" not in a
        or ("--use-distributed-optimizer" in a) == (_i(a, "--megatron-fsdp-version") == 1),
    ),
    ArgRule(
        "arguments.py:1336",
        "--seq-length is a multiple of 2 x --context-parallel-size",
        lambda a, w: _i(a, "--context-parallel-size") == 1
        or _i(a, "--seq-length") % (2 * _i(a, "--context-parallel-size")) == 0,
    ),
    ArgRule(
        "megatron/core/tensor_parallel/mappings.py:74",
        "with --sequence-parallel, the sequence of a rank splits evenly over the tensor-parallel ranks",
        lambda a, w: "--sequence-parallel" not in a
        or _i(a, "--seq-length")
        % (_i(a, "--tensor-model-parallel-size") * _i(a, "--context-parallel-size")) == 0,
    ),
    ArgRule(
        "arguments.py:1442",
        "--tp-comm-overlap needs --sequence-parallel",
        lambda a, w: "--tp-comm-overlap" not in a or "--sequence-parallel" in a,
    ),
    ArgRule(
        "arguments.py:1477",
        "tensor or context parallelism (without FSDP) needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell",
        lambda a, w: (
            "--use-megatron-fsdp" in a
            or (_i(a, "--tensor-model-parallel-size") == 1 and _i(a, "--context-parallel-size") == 1)
            or a["env"].get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"
        ),
    ),
    ArgRule(
        "megatron/core/num_microbatches_calculator.py:381",
        "--global-batch-size is divisible by "
        "--micro-batch-size x data-parallel size (world / (TP x PP x CP))",
        lambda a, w: (
            _i(a, "--global-batch-size")
            % (
                _i(a, "--micro-batch-size")
                * (
                    w
                    // (
                        _i(a, "--tensor-model-parallel-size")
                        * _i(a, "--pipeline-model-parallel-size")
                        * _i(a, "--context-parallel-size")
                    )
                )
            )
            == 0
        ),
    ),
    ArgRule(
        "megatron/core/parallel_state.py:822",
        "the world size is divisible by TP x PP x CP",
        lambda a, w: (
            w
            % (
                _i(a, "--tensor-model-parallel-size")
                * _i(a, "--pipeline-model-parallel-size")
                * _i(a, "--context-parallel-size")
            )
            == 0
        ),
    ),
    ArgRule(
        "megatron/core/parallel_state.py:881",
        "the world size is divisible by ETP x EP x PP",
        lambda a, w: (
            w
            % (
                _i(a, "--expert-tensor-parallel-size", _i(a, "--tensor-model-parallel-size"))
                * _i(a, "--expert-model-parallel-size")
                * _i(a, "--pipeline-model-parallel-size")
            )
            == 0
        ),
    ),
)
"""The rules Megatron-LM checks in its training script (or in code that needs a process group), with
their lines at NVIDIA/Megatron-LM d98e8a64; checked against the emitted arguments."""


def megatron_arg_problems(launch: Launch, world: int) -> list[str]:
    a = parse_args(launch)
    return [f"{r.source}: {r.what}" for r in MEGATRON_ARG_RULES if not r.holds(a, world)]


def _pipeline_dtype(cfg: dict[str, Any]) -> Any:
    import torch

    return torch.bfloat16 if cfg.get("bf16") else torch.float16 if cfg.get("fp16") else torch.float32


def transformer_config_problems(cfg: dict[str, Any]) -> list[str]:
    """Build megatron-core's TransformerConfig (its __post_init__ and ModelParallelConfig's checks)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    # multi-latent attention's fields (q_lora_rank, kv_lora_rank, ...) live on MLATransformerConfig,
    # the class Megatron-LM builds when --multi-latent-attention is given
    cls = MLATransformerConfig if cfg.get("multi_latent_attention") else TransformerConfig
    try:
        cls(**cfg, pipeline_dtype=_pipeline_dtype(cfg), params_dtype=_pipeline_dtype(cfg))
    except (ValueError, AssertionError, TypeError) as exc:
        return [f"TransformerConfig: {exc}"]
    return []


def rank_generator_problems(cfg: dict[str, Any], world: int, order: str) -> list[str]:
    """megatron-core's RankGenerator for the dense and the expert layers, as initialize_model_parallel
    builds them (parallel_state.py: world divisible by TP x PP x CP and by ETP x EP x PP first)."""
    from megatron.core.parallel_state import RankGenerator

    tp, pp, cp = (
        cfg.get(k, 1) or 1
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
    )
    ep, etp = cfg.get("expert_model_parallel_size", 1) or 1, cfg.get("expert_tensor_parallel_size") or tp
    if world % (tp * pp * cp) or world % (etp * ep * pp):
        return [f"world {world} is not divisible by TP*PP*CP={tp * pp * cp} or ETP*EP*PP={etp * ep * pp}"]
    try:
        dense = RankGenerator(tp=tp, ep=1, dp=world // (tp * pp * cp), pp=pp, cp=cp, order=order)
        expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
        tp_groups = dense.get_ranks("tp")
        expert.get_ranks("ep")
    except (AssertionError, RuntimeError, ValueError) as exc:
        return [f"RankGenerator: {exc}"]
    expert_dp, dp = world // (etp * ep * pp), world // (tp * pp * cp)
    if not order.endswith("pp") and pp > 1 and expert_dp != dp:  # parallel_state.py:902
        return [f"order {order}: the attention ({dp}) and expert ({expert_dp}) data-parallel sizes differ"]
    if tp_groups[0] != list(range(tp)):
        return [f"tensor-parallel group 0 is {tp_groups[0][:8]}, not the first {tp} ranks"]
    return []


def check_megatron(launch: Launch, world: int) -> list[str]:
    cfg = launch.config["transformer_config"]
    order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in launch.args else "tp-cp-ep-dp-pp"
    return (
        megatron_arg_problems(launch, world)
        + transformer_config_problems(cfg)
        + rank_generator_problems(cfg, world, order)
    )


# src/megatron/bridge/training/mixed_precision.py:185-405 at NVIDIA-NeMo/Megatron-Bridge 067f987d
BRIDGE_PRECISION_RECIPES = (
    "bf16_mixed", "fp16_mixed",
    "bf16_with_fp8_delayed_scaling_mixed", "fp16_with_fp8_delayed_scaling_mixed",
    "bf16_with_mxfp8_mixed", "fp16_with_mxfp8_mixed", "bf16_with_fp8_current_scaling_mixed",
    "fp16_with_fp8_current_scaling_mixed", "bf16_with_fp8_subchannel_scaling_mixed",
    "fp16_with_fp8_subchannel_scaling_mixed", "bf16_with_nvfp4_mixed",
)


def check_nemo(launch: Launch, world: int) -> list[str]:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    cfg = launch.config
    problems = transformer_config_problems(cfg["model"])
    mapping = any(o.startswith("dist.use_tp_pp_dp_mapping=true") for o in launch.args)
    order = "tp-cp-ep-pp-dp" if mapping else "tp-cp-ep-dp-pp"
    problems += rank_generator_problems(cfg["model"], world, order)
    try:
        ddp = DistributedDataParallelConfig(**cfg["ddp"])
        OptimizerConfig(**cfg["optimizer"])
    except (ValueError, AssertionError, TypeError) as exc:
        return [*problems, f"DistributedDataParallelConfig/OptimizerConfig: {exc}"]
    # arguments.py:1025 and :1170 hold for the Bridge's DDP config too
    if ddp.overlap_param_gather and not (ddp.use_distributed_optimizer or ddp.use_megatron_fsdp):
        problems.append(
            "arguments.py:1025: overlap_param_gather needs the distributed optimizer or Megatron FSDP"
        )
    if ddp.use_megatron_fsdp and mapping:  # Megatron-Bridge src/megatron/bridge/training/config.py:1124
        problems.append("Megatron-Bridge config.py:1124: use_tp_pp_dp_mapping is not supported with "
                        "Megatron FSDP")
    if cfg.get("mixed_precision", "bf16_mixed") not in BRIDGE_PRECISION_RECIPES:
        problems.append(f"mixed_precision={cfg['mixed_precision']} is not a Megatron-Bridge recipe")
    if ddp.use_megatron_fsdp and cfg.get("checkpoint", {}).get("ckpt_format") != "fsdp_dtensor":
        problems.append("arguments.py:1170: Megatron FSDP needs checkpoint.ckpt_format=fsdp_dtensor")
    model = cfg["model"]
    dp = world // (
        model["tensor_model_parallel_size"]
        * model["pipeline_model_parallel_size"]
        * model.get("context_parallel_size", 1)
    )
    if cfg["train"]["global_batch_size"] % (cfg["train"]["micro_batch_size"] * dp):
        problems.append(
            "num_microbatches_calculator.py:381: global batch not divisible by micro x data-parallel"
        )
    return problems


# ---------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------


def check_deepspeed(launch: Launch, data_parallel: int) -> list[str]:
    """DeepSpeedConfig parses the config with this many data-parallel ranks (its batch-triple and
    ZeRO checks); the pipeline engine's ZeRO assertion (pipe/engine.py:77) needs a built model and
    process group, so it is checked here as the rule it is."""
    from unittest import mock

    import deepspeed.runtime.config as ds_config

    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: data_parallel)
    try:
        with mock.patch.object(ds_config.dist, "get_rank", lambda *a, **k: 0):
            cfg = ds_config.DeepSpeedConfig(dict(launch.config), mpu=mpu)
    except (ValueError, AssertionError, TypeError, Exception) as exc:
        return [f"DeepSpeedConfig: {type(exc).__name__}: {exc}"]
    problems = []
    stages = launch.config.get("pipeline", {}).get("stages", 1)
    if stages != "auto" and int(stages) > 1 and cfg.zero_optimization_stage >= 2:
        problems.append(
            "deepspeed/runtime/pipe/engine.py:77: ZeRO-2 and ZeRO-3 are incompatible with "
            "pipeline parallelism"
        )
    return problems


# ---------------------------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------------------------


def check_torchtitan(launch: Launch, world: int, num_layers: int) -> list[str]:
    """Parse the emitted overrides with tyro into torchtitan's own config sections (as its
    ConfigManager does with the recipe's Trainer.Config), build ParallelDims (world-size product), and
    ask its pipeline code how many stages the layers make."""
    from dataclasses import field, make_dataclass

    import tyro
    from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import pipeline_parallel
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    sections = make_dataclass(
        "Sections",
        [  # the sections of Trainer.Config the launch overrides
            ("parallelism", ParallelismConfig, field(default_factory=ParallelismConfig)),
            ("training", TrainingConfig, field(default_factory=TrainingConfig)),
            ("compile", CompileConfig, field(default_factory=CompileConfig)),
            (
                "activation_checkpoint",
                ActivationCheckpointingConfig,
                field(default_factory=SelectiveAC.Config),
            ),
        ],
    )

    argv: list[str] = []
    for arg in launch.args:
        argv += shlex.split(arg)
    try:
        cfg = tyro.cli(sections, args=argv)
    except SystemExit as exc:
        return [f"tyro could not parse the overrides {argv}: exit {exc.code}"]
    par = cfg.parallelism
    problems = []
    ac = cfg.activation_checkpoint
    want = launch.config["activation_checkpoint"]
    kind = "none" if ac is None else "full" if type(ac).__qualname__.startswith("FullAC") else "selective"
    if kind != want:
        problems.append(f"activation_checkpoint parsed as {kind}, emitted {want}")
    try:
        dims = ParallelDims.from_config(par, world)
    except (AssertionError, ValueError) as exc:
        return [*problems, f"ParallelDims: {exc}"]
    if par.pipeline_parallel_degree > 1:
        if cfg.training.local_batch_size % par.pipeline_parallel_microbatch_size:
            problems.append("trainer.py: local_batch_size not divisible by pipeline_parallel_microbatch_size")
        model_cfg = SimpleNamespace(layers=[None] * num_layers)
        try:
            stages, *_ = pipeline_parallel._get_pipeline_metadata(dims, par, model_cfg)
        except ValueError as exc:
            return [*problems, f"pipeline_parallel: {exc}"]
        expected = par.pipeline_parallel_degree * launch.config["vpp"]
        if stages != expected:
            problems.append(f"pipeline_parallel makes {stages} stages, the plan has pp x vpp = {expected}")
    dp = dims.dp_replicate * dims.dp_shard
    gb, lb = cfg.training.global_batch_size, cfg.training.local_batch_size
    if gb % (lb * dp):
        problems.append(
            f"training.global_batch_size={gb} is not a multiple of local_batch_size x dp = {lb * dp}"
        )
    return problems


# ---------------------------------------------------------------------------------------------
# LLM Foundry (FSDP) and the gridtune engine
# ---------------------------------------------------------------------------------------------


def check_fsdp(launch: Launch, world: int) -> list[str]:
    """The FSDP names exist in PyTorch's enums; Composer's batch rule (the global batch splits into
    whole device micro-batches: composer/trainer/trainer.py's device_train_batch_size)."""
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    cfg = launch.config
    problems = []
    fsdp = cfg["fsdp_config"]
    for enum, key in ((ShardingStrategy, "sharding_strategy"), (BackwardPrefetch, "backward_prefetch")):
        if fsdp[key] not in enum.__members__:
            problems.append(f"fsdp_config.{key}={fsdp[key]} is not a {enum.__name__}")
    gb, mb = cfg["global_train_batch_size"], cfg["device_train_microbatch_size"]
    if gb % world or (gb // world) % mb:
        problems.append(
            f"global_train_batch_size={gb} does not split into {world} devices x micro-batches of {mb}"
        )
    return problems


def check_gridtune(launch: Launch, model: Model, training: Training) -> list[str]:
    """The engine's own refusal rules (engine.train.engine_problems) on the plan the launch carries."""
    from engine.train import engine_problems
    from perfmodels.io import plan_from_dict

    plan = plan_from_dict(launch.config["plan"])
    return engine_problems(model, plan, training)


def check(
    kind: str, launch: Launch, model: Model, cluster: Cluster, training: Training, plan: Plan
) -> list[str]:
    """Every framework check of `kind` on this launch ([] when all pass)."""
    from tuner.launch import target
    from tuner.launch.common import layout_of

    kind = target(kind).kind
    lay = layout_of(model, training, plan, uneven=False)
    if kind == "megatron":
        return check_megatron(launch, lay.world)
    if kind == "nemo":
        return check_nemo(launch, lay.world)
    if kind == "deepspeed":
        return check_deepspeed(launch, lay.dp)
    if kind == "torchtitan":
        return check_torchtitan(launch, lay.world, model.num_layers)
    if kind == "fsdp":
        return check_fsdp(launch, lay.world)
    return check_gridtune(launch, model, training)


# ---------------------------------------------------------------------------------------------
# What layout a launch states, read back from what was emitted
# ---------------------------------------------------------------------------------------------

LAYOUT_KEYS = (
    "tp",
    "pp",
    "vpp",
    "dp",
    "micro_batch_size",
    "global_batch_size",
    "zero_stage",
    "recompute",
    "sequence_parallel",
)


def emitted_layout(kind: str, launch: Launch, world: int) -> dict[str, Any]:
    """The layout the launch tells its framework to run, read from the emitted arguments/config (not
    from the plan), in the `LAYOUT_KEYS` terms; compare with `plan_layout`."""
    from tuner.launch import target

    kind = target(kind).kind
    if kind == "megatron":
        a = parse_args(launch)
        tp, pp, cp = (
            _i(a, f)
            for f in (
                "--tensor-model-parallel-size",
                "--pipeline-model-parallel-size",
                "--context-parallel-size",
            )
        )
        if "--pipeline-model-parallel-layout" in a:  # arguments.py:941-950: chunks / pp
            from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

            layout = a["--pipeline-model-parallel-layout"]
            vpp = PipelineParallelLayerLayout.get_num_stages_from_str(layout) // pp
        elif "--num-virtual-stages-per-pipeline-rank" in a:
            vpp = _i(a, "--num-virtual-stages-per-pipeline-rank")
        elif "--num-layers-per-virtual-pipeline-stage" in a:
            vpp = _i(a, "--num-layers") // pp // _i(a, "--num-layers-per-virtual-pipeline-stage")
        else:
            vpp = 1
        zero = 3 if "--use-megatron-fsdp" in a else 1 if "--use-distributed-optimizer" in a else 0
        recompute = a.get("--recompute-granularity", "none")
        return dict(
            tp=tp,
            pp=pp,
            vpp=vpp,
            dp=world // (tp * pp * cp),
            micro_batch_size=_i(a, "--micro-batch-size"),
            global_batch_size=_i(a, "--global-batch-size"),
            zero_stage=zero,
            recompute=recompute,
            sequence_parallel="--sequence-parallel" in a,
        )
    if kind == "nemo":
        m, ddp = launch.config["model"], launch.config["ddp"]
        tp, pp, cp = (
            m["tensor_model_parallel_size"],
            m["pipeline_model_parallel_size"],
            m["context_parallel_size"],
        )
        zero = 3 if ddp.get("use_megatron_fsdp") else 1 if ddp["use_distributed_optimizer"] else 0
        return dict(
            tp=tp,
            pp=pp,
            vpp=m.get("virtual_pipeline_model_parallel_size", 1),
            dp=world // (tp * pp * cp),
            micro_batch_size=launch.config["train"]["micro_batch_size"],
            global_batch_size=launch.config["train"]["global_batch_size"],
            zero_stage=zero,
            recompute=m.get("recompute_granularity", "none"),
            sequence_parallel=m["sequence_parallel"],
        )
    if kind == "deepspeed":
        c = launch.config
        pp = c.get("pipeline", {}).get("stages", 1)
        tp = c.get("tensor_parallel", {}).get("autotp_size", 1)
        for arg in launch.args[0].split("\\\n") if launch.args else []:
            if "--tensor-model-parallel-size" in arg:
                tp = int(arg.split()[-1])
        return dict(
            tp=tp,
            pp=pp,
            vpp=1,
            dp=world // (tp * pp),
            micro_batch_size=c["train_micro_batch_size_per_gpu"],
            global_batch_size=c["train_batch_size"],
            zero_stage=c["zero_optimization"]["stage"],
            recompute="full"
            if "activation_checkpointing" in c
            else "selective"
            if launch.args and "--recompute-granularity selective" in launch.args[0]
            else "none",
            sequence_parallel=False,
        )
    if kind == "torchtitan":
        p, t = launch.config["parallelism"], launch.config["training"]
        dp = p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"]
        zero = (
            0
            if p["data_parallel_shard_degree"] == 1
            else (3 if p["fsdp_reshard_after_forward"] == "always" else 2)
        )
        mb = (
            p.get("pipeline_parallel_microbatch_size", t["local_batch_size"])
            if p["pipeline_parallel_degree"] > 1
            else t["local_batch_size"]
        )
        return dict(
            tp=p["tensor_parallel_degree"],
            pp=p["pipeline_parallel_degree"],
            vpp=launch.config["vpp"],
            dp=dp,
            micro_batch_size=mb,
            global_batch_size=t["global_batch_size"],
            zero_stage=zero,
            recompute=launch.config["activation_checkpoint"],
            sequence_parallel=p["enable_sequence_parallel"] and p["tensor_parallel_degree"] > 1,
        )
    if kind == "fsdp":
        c = launch.config
        zero = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}[c["fsdp_config"]["sharding_strategy"]]
        return dict(
            tp=1,
            pp=1,
            vpp=1,
            dp=world,
            micro_batch_size=c["device_train_microbatch_size"],
            global_batch_size=c["global_train_batch_size"],
            zero_stage=zero,
            recompute="full" if c["fsdp_config"]["activation_checkpointing"] else "none",
            sequence_parallel=False,
        )
    from perfmodels.io import plan_from_dict

    plan = plan_from_dict(launch.config["plan"])
    return plan_layout(plan, launch.config["global_batch_size"])  # the engine takes the plan itself


def plan_layout(plan: Plan, global_batch_size: int) -> dict[str, Any]:
    """The same keys for a ranked plan."""
    interleaved = plan.G_inter > 1 and plan.schedule == "interleaved-1f1b" and plan.virtual_stages > 1
    return dict(
        tp=plan.G_intra_r,
        pp=plan.G_inter,
        vpp=plan.virtual_stages if interleaved else 1,
        dp=plan.G_data * plan.G_intra_d,
        micro_batch_size=plan.micro_batch_size,
        global_batch_size=global_batch_size,
        zero_stage=plan.zero_stage,
        recompute=plan.recompute,
        sequence_parallel=bool(plan.sequence_parallel),
    )
