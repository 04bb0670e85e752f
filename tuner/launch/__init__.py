"""The ranked best plan as something to launch, for the stack it was ranked for.

Why: a ranking is only useful once it runs, and a command is only right for the plan it was ranked
as. Each emitter (`KINDS`) launches the stacks in `TARGETS[kind].stacks`, and refuses a plan that
stack cannot start (`launch_problems`: the shared plan rules, the stack's layout kinds and the
launcher rules of `perfmodels/launchable.py`, each citing its framework line). The search ranks
only plans that pass them (tuner/constraints.py), so `gridtune recommend --emit KIND` ranks as
`TARGETS[KIND].default_stack` when no --stack is given and prints the best plan's launch.

    from tuner.launch import launch_for, stack_for_emit
    training = dataclasses.replace(training, stack=stack_for_emit("megatron"))
    rec = tuner.recommend(model, cluster, training)
    print(launch_for("megatron", model, cluster, training, rec.best.plan).text)

Emitters: `megatron` (Megatron-LM pretrain_gpt.py), `nemo` (NeMo 2 / Megatron-Bridge recipe
overrides), `deepspeed` (ds_config.json and the launcher), `torchtitan` (torchtitan.train overrides),
`fsdp` (LLM Foundry YAML), `gridtune` (the engine; `torchrun` is its old name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodels.launchable import stack_problems
from perfmodels.specs import Cluster, Model, Plan, Training, plan_problems
from tuner.launch.common import Launch
from tuner.launch.deepspeed import deepspeed
from tuner.launch.fsdp import fsdp
from tuner.launch.gridtune import gridtune
from tuner.launch.megatron import megatron
from tuner.launch.nemo import nemo
from tuner.launch.torchtitan import torchtitan


@dataclass(frozen=True, kw_only=True)
class Target:
    """One emitter: the stacks it launches (the first is what `--emit` ranks as without --stack)."""

    kind: str
    stacks: tuple[str, ...]
    build: Callable[[Model, Cluster, Training, Plan], Launch]
    what: str

    @property
    def default_stack(self) -> str:
        return self.stacks[0]


TARGETS: dict[str, Target] = {t.kind: t for t in (
    # pretrain_gpt.py also runs what the nemo preset ranks (distributed optimizer, Megatron FSDP,
    # --grad-reduce-in-bf16), and Megatron-Bridge what the megatron-core preset ranks
    Target(kind="megatron", stacks=("megatron-core", "megatron-lm", "nemo"), build=megatron,
           what="Megatron-LM pretrain_gpt.py arguments"),
    Target(kind="nemo", stacks=("nemo", "megatron-core"), build=nemo,
           what="NeMo 2 / Megatron-Bridge recipe overrides"),
    Target(kind="deepspeed", stacks=("deepspeed", "megatron-deepspeed"), build=deepspeed,
           what="a DeepSpeed config and its launcher"),
    Target(kind="torchtitan", stacks=("torchtitan",), build=torchtitan, what="torchtitan.train overrides"),
    Target(kind="fsdp", stacks=("fsdp",), build=fsdp, what="an LLM Foundry (Composer FSDP) YAML"),
    Target(kind="gridtune", stacks=("gridtune",), build=gridtune, what="the gridtune engine's torchrun line"),
)}
ALIASES = {"torchrun": "gridtune"}
KINDS = (*TARGETS, *ALIASES)
"""What `--emit` accepts."""


def target(kind: str) -> Target:
    name = ALIASES.get(kind, kind)
    if name not in TARGETS:
        raise ValueError(f"--emit must be one of {list(KINDS)}, got {kind!r}")
    return TARGETS[name]


def stack_for_emit(kind: str) -> str:
    """The stack `--emit KIND` ranks as when no --stack is given."""
    return target(kind).default_stack


def kinds_for_stack(stack_name: str) -> list[str]:
    """The emitters that launch `stack_name`, its own first (empty: none does, e.g. oneflow)."""
    kinds = [t.kind for t in TARGETS.values() if stack_name in t.stacks]
    return sorted(kinds, key=lambda k: TARGETS[k].default_stack != stack_name)


def kind_for_stack(stack_name: str) -> str | None:
    """The emitter whose own stack `stack_name` is (else the first that launches it; None: none)."""
    kinds = kinds_for_stack(stack_name)
    return kinds[0] if kinds else None


def check_emit_stack(kind: str, stack_name: str) -> None:
    """ValueError when `--emit KIND` cannot launch the stack the search ranks for."""
    t = target(kind)
    if stack_name not in t.stacks:
        raise ValueError(f"--emit {kind} launches the {' or '.join(t.stacks)} stack, but --stack "
                         f"{stack_name} ranks {stack_name} layouts: drop --stack (it then ranks as "
                         f"{t.default_stack}) or emit "
                         f"{kind_for_stack(stack_name) or 'nothing: no emitter launches ' + stack_name}")


def launch_problems(kind: str, model: Model, cluster: Cluster, training: Training, plan: Plan) -> list[str]:
    """Why `kind` cannot launch `plan` for `training`'s stack (empty: it can): the shared plan rules
    (`specs.plan_problems`), the stack's launcher rules in words (`launchable.stack_problems`), and
    every other constraint the search applies (`tuner/constraints.py`, on this one plan)."""
    from tuner import constraints as C

    t = target(kind)
    stack = training.effective_stack
    if stack.name not in t.stacks:
        return [f"--emit {t.kind} launches the {' or '.join(t.stacks)} stack, not {stack.name}"]
    problems = plan_problems(model, training, plan) + stack_problems(model, training, plan)
    if model.kind != "transformer" and t.kind != "gridtune":
        problems.append(f"the model is a list of layers: --emit {t.kind} writes a transformer's shape; the "
                        "gridtune engine (--emit gridtune) runs any nn.Module")
    worded = {C.query_groups_split, C.stack_layer_split, C.stack_zero_stages, C.stack_recompute,
              C.stack_tp_with_pp, C.enough_layers, C.sequence_parallel_shape}
    cols = _columns(plan)
    for rule in (*C.GRID_CONSTRAINTS, *C.PLAN_CONSTRAINTS):
        if rule in worded:
            continue
        rejection = rule(model, cluster, training, cols)
        if bool(rejection.mask[0]):
            problems.append(rejection.example(0))
    if stack.launch_placements and not _placement_ok(stack.launch_placements, plan):
        problems.append(f"placement {'/'.join(plan.order)}: the {stack.name} stack builds only "
                        f"{[list(p) for p in stack.launch_placements]}")
    return list(dict.fromkeys(problems))


def _columns(plan: Plan) -> dict[str, np.ndarray]:
    """One plan as the search's columns (every scalar Plan field; schedule and recompute as codes)."""
    from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE
    from perfmodels.specs import SCALAR_PLAN_FIELDS

    cols = {}
    for name in SCALAR_PLAN_FIELDS:
        value = getattr(plan, name)
        if name == "schedule":
            value = SCHEDULE_CODE[value]
        elif name == "recompute":
            value = RECOMPUTE_CODE[value]
        cols[name] = np.asarray([value if value is not None else 0])
    return cols


def _placement_ok(orders: tuple[tuple[str, ...], ...], plan: Plan) -> bool:
    """The plan's order, restricted to the axes of degree > 1, is one of the stack's orders alike."""
    from tuner.search import complete_order

    mine = [a for a in plan.order if plan.degree(a) > 1]
    return any([a for a in complete_order(o) if a in mine] == mine for o in orders)


def launch_for(kind: str, model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    """The launch of `plan` with emitter `kind` (one of KINDS); ValueError naming every reason the
    stack cannot start it."""
    t = target(kind)
    problems = launch_problems(t.kind, model, cluster, training, plan)
    if problems:
        raise ValueError(f"--emit {t.kind} cannot launch this plan: " + "; ".join(problems))
    return t.build(model, cluster, training, plan)


def all_launches(model: Model, cluster: Cluster, training: Training, plan: Plan) -> dict[str, dict[str, Any]]:
    """The REST and `--json` answer's `launch`: {kind: Launch.to_dict()} for every emitter that launches
    the stack the plan was ranked for (the same text `--emit KIND` prints); empty when none does. A
    plan an emitter refuses gets `text` "" and the reasons in `notes`."""
    out: dict[str, dict[str, Any]] = {}
    for kind in kinds_for_stack(training.effective_stack.name):
        try:
            out[kind] = launch_for(kind, model, cluster, training, plan).to_dict()
        except ValueError as exc:
            out[kind] = Launch(kind=kind, stack=training.effective_stack.name, text="",
                               notes=(str(exc),)).to_dict()
    return out
