"""Request and response models of /v1/calibrations (kept apart from api/schemas.py, which they use).

A calibration body is the cluster and the user's measured runs, each as the same Model, Training and
Plan objects /v1/predict takes, plus what was measured."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field

from api.schemas import ClusterIn, ModelIn, PlanIn, TrainingIn, _In, _no_nul, _Out, _Root

MAX_RUNS = 64
"""Runs one calibration takes (each costs a prediction per fit step, and leave-one-out refits)."""

EXAMPLE: dict[str, Any] = {
    "name": "selene-megatron-core",
    "cluster": {"preset": "selene", "num_gpus": 64},
    "runs": [
        {"model": {"preset": "gpt3-7.5b"}, "training": {"global_batch_size": 256, "stack": "megatron-core"},
         "plan": {"G_data": 8, "G_intra_r": 8, "micro_batch_size": 2}, "iteration_time_s": 6.1,
         "peak_memory_gib": 31.0},
        {"model": {"preset": "gpt3-7.5b"}, "training": {"global_batch_size": 256, "stack": "megatron-core"},
         "plan": {"G_data": 16, "G_intra_r": 4, "micro_batch_size": 1}, "iteration_time_s": 5.4},
        {"model": {"preset": "gpt3-7.5b"}, "training": {"global_batch_size": 256, "stack": "megatron-core"},
         "plan": {"G_data": 8, "G_inter": 2, "G_intra_r": 4, "micro_batch_size": 1},
         "iteration_time_s": 6.0},
    ],
}


class CalibrationRunIn(_In):
    """One measured run: what ran (as /v1/predict takes it) and what was measured. `cluster` (optional)
    overrides the body's cluster for this run (another GPU count of the same machines)."""

    model: ModelIn
    training: TrainingIn
    plan: PlanIn
    iteration_time_s: Annotated[float, Field(gt=0, le=1e7, description="measured seconds per optimizer step")]
    peak_memory_gib: Annotated[float, Field(gt=0, le=1e5, description="measured peak GiB per GPU")] | None = (
        None)
    cluster: ClusterIn | None = None


class CalibrationCreate(_Root):
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE]})

    name: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)] | None = None
    cluster: ClusterIn
    runs: Annotated[list[CalibrationRunIn], Field(min_length=1, max_length=MAX_RUNS)]


class ParameterOut(_Out):
    value: float
    prior: float
    fitted: bool
    unit: str = ""


class CalibratedRunOut(_Out):
    measured_s: float
    predicted_s_before: float
    predicted_s_after: float


class CalibrationOut(_Out):
    profile_id: str
    name: str
    parameters: dict[str, ParameterOut]
    loo_mape: float
    uncertainty_rel: float | None = None
    runs: list[CalibratedRunOut]
