"""What a training stack's launcher accepts, in words: the rules beyond `Stack.can_run`'s layout
kinds that the frameworks enforce when they start, each citing the line that enforces it.

The predicates are in `perfmodels/rules.py` (vectorized; `tuner/constraints.py` applies them to whole
columns of plans, so the search never ranks a plan its stack cannot start); `stack_problems` words
them for one plan the way `specs.plan_problems` words the shared rules, and the launch emitters
(`tuner/launch/`) refuse a plan that breaks one.

Sources (commits of the repositories the rules were read from):
- Megatron-LM / Megatron-Core: NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
  (`megatron/training/arguments.py`, `megatron/core/transformer/transformer_config.py`,
  `megatron/core/model_parallel_config.py`), and tag core_v0.15.3
  (309ffca6a40553362d44fd17efc56b772fa1aa44) for the key/value split.
- DeepSpeed: deepspeedai/DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641.
- torchtitan: pytorch/torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodels import rules
from perfmodels.specs import Model, Plan, Training


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One launcher rule: its name, the stacks it binds (by the Stack field that turns it on), and
    the framework source line that enforces it."""

    name: str
    applies: str
    source: str


RULES: tuple[Rule, ...] = (
    Rule(
        name="query_groups_split_exact",
        applies="Stack.tp_splits_query_groups",
        source="Megatron-Core core_v0.15.3 megatron/core/transformer/attention.py:169 "
        "`divide(self.config.num_query_groups, world_size)` (0.16 added sub-sharding, #2565, which "
        "the cost model does not price); torchtitan torchtitan/models/common/attention.py:698 views "
        "the column-sharded K/V as whole heads of head_dim",
    ),
    Rule(
        name="heads_split",
        applies="Stack.tensor_parallel",
        source="Megatron-LM megatron/core/transformer/transformer_config.py:1446 "
        "`num_attention_heads % tensor_model_parallel_size != 0` raises",
    ),
    Rule(
        name="even_layer_split",
        applies="Stack.pipeline_layer_split == 'megatron'",
        source="Megatron-LM megatron/training/arguments.py:997 (layers divisible by the pipeline size) "
        "and :968-972 (with --num-layers-per-virtual-pipeline-stage, by the virtual size too)",
    ),
    Rule(
        name="megatron_uneven_split",
        applies="Stack.pipeline_layer_split == 'megatron'",
        source="Megatron-LM megatron/core/transformer/transformer_config.py:2294-2366 "
        "(first/last stage counts > 0 and divisible by the virtual size; the middle layers "
        "divisible by the middle stages, and per middle rank by the virtual size)",
    ),
    Rule(
        name="megatron_layout_split",
        applies="Stack.pipeline_layer_split == 'megatron-core'",
        source="Megatron-LM megatron/training/arguments.py:927-950 and :3103 "
        "(--pipeline-model-parallel-layout sets each chunk's layers and the virtual size) at d98e8a64; "
        "megatron-core 0.16.0 "
        "PipelineParallelLayerLayout.validate_layer_layout (the embedding first, the loss last, "
        "every decoder layer once)",
    ),
    Rule(
        name="torchtitan_layer_split",
        applies="Stack.pipeline_layer_split == 'torchtitan'",
        source="torchtitan torchtitan/distributed/pipeline_parallel.py:223-252 (ceil((layers + weights) "
        "/ layers_per_stage) stages, divisible by pp; one stage per rank for single-stage "
        "schedules, at least two for looped ones)",
    ),
    Rule(
        name="pipeline_zero",
        applies="Stack.pipeline_max_zero_stage",
        source="DeepSpeed deepspeed/runtime/pipe/engine.py:77 `zero_optimization_stage() < "
        'ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"`',
    ),
    Rule(
        name="launch_zero_stages",
        applies="Stack.launch_zero_stages",
        source="Megatron-LM megatron/training/arguments.py:3156 (--use-distributed-optimizer: ZeRO-1) and "
        ":1118-1170, :3190 (--use-megatron-fsdp with --data-parallel-sharding-strategy "
        "optim_grads_params: ZeRO-3); no ZeRO-2 optimizer",
    ),
    Rule(
        name="launch_recomputes",
        applies="Stack.launch_recomputes",
        source="DeepSpeed deepspeed/runtime/activation_checkpointing/checkpointing.py:1058 (`checkpoint` "
        "recomputes a whole function); LLM Foundry's fsdp_config.activation_checkpointing (whole blocks); "
        "the engine's engine/train.py:299 `engine_limits` (recompute 'full' or 'none')",
    ),
    Rule(
        name="launch_tp_with_pp",
        applies="Stack.launch_tp_with_pp",
        source="DeepSpeed deepspeed/runtime/engine.py:654-671 (AutoTP's `_configure_tensor_parallel` sets "
        "the engine's mpu to its own tensor x data mesh) vs deepspeed/runtime/pipe/engine.py:102 (the "
        "pipeline engine's grid is the PipelineModule's topology)",
    ),
    Rule(
        name="sequence_parallel_seq_split",
        applies="every stack with sequence parallelism",
        source="Megatron-LM megatron/core/tensor_parallel/mappings.py:74 \"First dimension of the tensor "
        "should be divisible by tensor parallel size\"",
    ),
    Rule(
        name="sequence_parallel_has_rows",
        applies="every stack",
        source='Megatron-LM megatron/core/model_parallel_config.py:502 "Cannot use sequence parallelism '
        'without tensor parallelism"',
    ),
)
"""Every launcher rule with its source line (tests/tuner/test_launch_frameworks.py checks the emitted
arguments against this table where the rule lives only in Megatron-LM's arguments.py)."""


def stack_problems(model: Model, training: Training, plan: Plan) -> list[str]:
    """The launcher rules of `training`'s stack this plan breaks, each naming fields and values
    (empty when the stack can start it)."""
    stack = training.effective_stack
    problems: list[str] = []
    name = stack.name
    r, S, v = plan.G_intra_r, plan.G_inter, plan.virtual_stages
    if model.kind == "transformer" and stack.tp_splits_query_groups and r > 1:
        groups = int(model.num_query_groups)
        if not rules.query_groups_split_exact(groups, r):
            problems.append(
                f"G_intra_r={r} does not divide model.num_query_groups={groups}: the {name} "
                "stack splits the key/value groups over the tensor-parallel ranks"
            )
    if S > 1 and not rules.layer_split(stack.pipeline_layer_split, model.depth, S, v):
        how = {
            "megatron": "evenly or with Megatron's first/last-stage counts",
            "megatron-core": "evenly, with first/last-stage counts or a layout of a layer per chunk at least",
            "torchtitan": "into ceil(layers / chunks)-layer stages",
        }.get(stack.pipeline_layer_split, "")
        problems.append(
            f"model.num_layers={model.depth} does not split over G_inter*virtual_stages = "
            f"{S}*{v} {how} ({name} stack)"
        )
    if not rules.pipeline_zero(S, plan.zero_stage, stack.pipeline_max_zero_stage):
        problems.append(
            f"zero_stage={plan.zero_stage} with G_inter={S}: the {name} stack's pipeline allows "
            f"ZeRO <= {stack.pipeline_max_zero_stage}"
        )
    offered = stack.launch_zero_stages or stack.zero_stages
    if plan.zero_stage not in offered:
        problems.append(
            f"zero_stage={plan.zero_stage}: the {name} stack's launcher offers ZeRO stages {list(offered)}"
        )
    if stack.launch_recomputes and plan.recompute not in stack.launch_recomputes:
        problems.append(
            f"recompute={plan.recompute!r}: the {name} stack's launcher recomputes only "
            f"{list(stack.launch_recomputes)}"
        )
    if not stack.launch_tp_with_pp and r > 1 and S > 1:
        problems.append(
            f"G_intra_r={r} with G_inter={S}: the {name} stack runs tensor or pipeline parallelism, "
            "not both (DeepSpeed's AutoTP and pipeline engine each build their own groups)"
        )
    cp = int(getattr(plan, "G_cp", 1) or 1)
    if (plan.sequence_parallel and model.kind == "transformer"
            and not rules.sequence_parallel_seq_split(model.seq_length, r, cp)):
        problems.append(f"plan.sequence_parallel with G_intra_r={r}: model.seq_length={model.seq_length} "
                        f"does not split evenly over G_intra_r*G_cp = {r * cp}")
    if plan.sequence_parallel and not rules.sequence_parallel_has_rows(r):
        problems.append("plan.sequence_parallel needs G_intra_r > 1 (tensor parallelism)")
    return problems
