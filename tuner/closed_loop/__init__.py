"""The closed loop's torch-free half: what an engine run is in the model's nouns, how good the
predictions were, measurement records, calibration from them, the service client and the
validation summary. One module per concern:

- `engine_run`: `local_cluster`, `engine_training`, `engine_search_options`, `candidate_plans`,
  `default_cluster_id`;
- `metrics`: `spearman`, `mape`, `predicted_rank_of_measured_best`, `spread_plans`;
- `records`: `measurement_record`, `record_specs`, `MEASURED_PARTS`;
- `calibration`: `calibrate_records`, `refit_constants`, `calibrate_cluster`,
  `latest_calibrated_profile`, `measured_run_scatter`;
- `client`: `service_url`, `post_measurement`, `service_recommend` (GRIDTUNE_URL);
- `summary`: `summarize`, `summary_json` (`gridtune validate`).

Why torch-free: the service and `gridtune validate`'s reporting use it without a framework;
`engine.train` (torch) calls it, as `tuner.closed_loop.<name>`, for everything that is not
training. This package re-exports those names so that callers need not know the split.
"""

from tuner.closed_loop.calibration import (
    CALIBRATED_PREFIX,
    LOO_MAX,
    Refit,
    calibrate_cluster,
    calibrate_records,
    calibrated_profile_name,
    calibration_pairs,
    latest_calibrated_profile,
    measured_run_scatter,
    refit_constants,
    uncorrected,
)
from tuner.closed_loop.client import ENV_URL, for_service, post_measurement, service_recommend, service_url
from tuner.closed_loop.engine_run import (
    candidate_plans,
    default_cluster_id,
    engine_search_options,
    engine_training,
    local_cluster,
)
from tuner.closed_loop.metrics import mape, predicted_rank_of_measured_best, spearman, spread_plans
from tuner.closed_loop.records import MEASURED_PARTS, measurement_record, record_specs
from tuner.closed_loop.summary import PlanResult, ValidationSummary, summarize, summary_json

__all__ = [
    "CALIBRATED_PREFIX",
    "ENV_URL",
    "LOO_MAX",
    "MEASURED_PARTS",
    "PlanResult",
    "Refit",
    "ValidationSummary",
    "calibrate_cluster",
    "calibrate_records",
    "calibrated_profile_name",
    "calibration_pairs",
    "candidate_plans",
    "default_cluster_id",
    "engine_search_options",
    "engine_training",
    "for_service",
    "latest_calibrated_profile",
    "local_cluster",
    "mape",
    "measured_run_scatter",
    "measurement_record",
    "post_measurement",
    "predicted_rank_of_measured_best",
    "record_specs",
    "refit_constants",
    "service_recommend",
    "service_url",
    "spearman",
    "spread_plans",
    "summarize",
    "summary_json",
    "uncorrected",
]
