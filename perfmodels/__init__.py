"""gridtune's performance model: step time, memory and traffic of any 4D-parallel layout.

Pure numpy/scipy (never torch), so the service and the tuner start without a deep-learning
framework. The public entry points:

    import perfmodels
    pred = perfmodels.predict(model, cluster, training, plan)      # -> Prediction
    batch = perfmodels.predict_many(model, cluster, training, plan_arrays)  # thousands at once
"""

from perfmodels import presets, stacks
from perfmodels.plans import PlanArrays, from_columns, from_plans
from perfmodels.specs import (
    GPU,
    Cluster,
    CollectiveFit,
    LayerSpec,
    MemoryBreakdown,
    Model,
    Plan,
    Prediction,
    Profile,
    TimeBreakdown,
    Training,
    validate_combination,
)
from perfmodels.stacks import STACK_PRESETS, Stack

__all__ = [
    "GPU",
    "STACK_PRESETS",
    "Cluster",
    "CollectiveFit",
    "LayerSpec",
    "MemoryBreakdown",
    "Model",
    "Plan",
    "PlanArrays",
    "Prediction",
    "Profile",
    "Stack",
    "TimeBreakdown",
    "Training",
    "from_columns",
    "from_plans",
    "predict",
    "predict_many",
    "presets",
    "stacks",
    "validate_combination",
]


def __getattr__(name: str):  # lazy: keeps `import perfmodels.specs` light for the engine
    if name in ("predict", "predict_many"):
        from perfmodels import steptime

        return getattr(steptime, name)
    raise AttributeError(name)
