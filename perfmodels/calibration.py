"""Calibrate the model from measured steps: per-component corrections and an uncertainty band.

The step time is (to first order) a sum of components that each scale with one kind of constant:

    step ~ c_compute * (compute + bubble + optimizer) + c_tp * exposed tensor-parallel comm
         + c_dp * (exposed data-parallel and depth comm) + c_pp * pipeline p2p

Given measured steps of a cluster, we solve for the non-negative multipliers c_k with scipy's
non-negative least squares on relative errors, with a ridge pull towards 1 (weight `prior`), so a
component that no measurement exercised keeps its profiled value and three measurements are enough
to fix the dominant ones. The multipliers become `Profile.corrections`, which
`perfmodels.steptime` applies; the profile's `source` becomes "calibrated" and its
`uncertainty_rel` is the leave-one-out median relative error (or the in-sample one when fewer than
three measurements exist), so later predictions say how far to trust them.

    profile = calibrate([(prediction, measured_seconds), ...], base=cluster.profile)
    cluster = dataclasses.replace(cluster, profile=profile)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from perfmodels.constants import BY_NAME, PARAMETERS, Parameter, apply_constants, priors
from perfmodels.plans import PlanArrays, from_plans
from perfmodels.specs import Cluster, Model, Plan, Prediction, Profile, Training, combination_problems
from perfmodels.steptime import UNCERTAINTY_CPU_PRESET, UNCERTAINTY_PRESET, predict_many

COMPONENTS = ("compute", "tp_comm", "dp_comm", "pp_p2p")


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """What the closed loop's calibration returns (`tuner.closed_loop.calibrate_records`): the profile,
    the fitted physical constants (`constants`; `corrections` only from the older per-component fit,
    `calibrate`), the error before and after, and the band."""

    profile: Profile
    corrections: dict[str, float]
    mape_before: float
    mape_after: float
    uncertainty_rel: float
    num_measurements: int
    constants: dict[str, float] = field(default_factory=dict)


def component_seconds(pred: Prediction) -> np.ndarray:
    """The four correctable parts of a prediction, in COMPONENTS order (seconds per step).

    They sum to the predicted step time, so corrections of 1 reproduce the uncorrected model."""
    b = pred.breakdown
    comm_exposed = b.exposed_comm_s - b.pp_p2p_s
    dp_share = (b.dp_comm_s + b.tp_comm_depth_s)
    tp_share = b.tp_comm_s
    total_comm = max(dp_share + tp_share, 1e-30)
    tp = comm_exposed * tp_share / total_comm
    dp = comm_exposed * dp_share / total_comm
    compute = pred.iteration_time_s - comm_exposed - b.pp_p2p_s
    return np.array([compute, tp, dp, b.pp_p2p_s])


def _fit(X: np.ndarray, y: np.ndarray, prior: float) -> np.ndarray:
    """min sum(((X c - y) / y)^2) + prior * sum((c - 1)^2), c >= 0."""
    A = X / y[:, None]
    b = np.ones(len(y))
    k = X.shape[1]
    A = np.vstack([A, np.sqrt(prior) * np.eye(k)])
    b = np.concatenate([b, np.sqrt(prior) * np.ones(k)])
    from scipy.optimize import nnls  # here, not at the top: scipy.optimize costs ~0.5 s to import

    c, _ = nnls(A, b)
    return c


def calibrate(pairs: Sequence[tuple[Prediction, float]], base: Profile | None = None, prior: float = 0.05,
              ) -> CalibrationResult:
    """Fit per-component corrections from (prediction made with `base`, measured step seconds)."""
    if not pairs:
        raise ValueError("calibrate needs at least one (prediction, measured_seconds) pair")
    for i, (_, measured) in enumerate(pairs):
        if not (isinstance(measured, (int, float)) and measured > 0 and np.isfinite(measured)):
            raise ValueError(
                f"measurements[{i}].iteration_time_s must be a positive number, got {measured!r}"
            )
    X = np.array([component_seconds(p) for p, _ in pairs])
    y = np.array([float(m) for _, m in pairs])
    old = np.array([base.correction(name) if base is not None else 1.0 for name in COMPONENTS])
    c = _fit(X, y, prior)
    fitted = X @ c
    before = float(np.mean(np.abs(X.sum(axis=1) - y) / y))
    after = float(np.mean(np.abs(fitted - y) / y))
    if len(y) >= 3:
        loo = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            ci = _fit(X[keep], y[keep], prior)
            loo.append(abs(X[i] @ ci - y[i]) / y[i])
        uncertainty = float(np.median(loo))
    else:
        uncertainty = max(after, 0.10)
    combined = {name: float(old[j] * c[j]) for j, name in enumerate(COMPONENTS)}
    extra = tuple((k, v) for k, v in (base.corrections if base else ()) if k not in combined)
    profile = replace(
        base or Profile(),
        corrections=tuple(sorted(combined.items())) + extra,
        source="calibrated",
        uncertainty_rel=max(uncertainty, 0.01),
    )
    return CalibrationResult(profile=profile, corrections=combined, mape_before=before, mape_after=after,
                             uncertainty_rel=profile.uncertainty_rel or uncertainty, num_measurements=len(y))


# --------------------------------------------------------------------------------------------
# Calibration of physical constants from measured runs (any stack, any model on the cluster)
# --------------------------------------------------------------------------------------------

RUN_NOISE_REL = 0.02
"""Run-to-run variation of a measured training step (1-2% on a quiet cluster): what a measured run
says about its own layout (`tuner.trials`). A run's residual in the fit also carries
`MODEL_DISCREPANCY_REL`."""
MODEL_DISCREPANCY_REL = 0.09
"""Relative scatter of the model about measured runs of one model, cluster and stack that no fitted
constant removes: the layout-to-layout structure the physics misses. Measured as the robust spread
(1.4826 x median absolute deviation) of log(predicted / measured) about each group's mean over the
published ranking groups of validation/data with at least 3 timed runs: 0.089 over 127 runs in 8
groups (2026-11-28). It weighs the differences between runs (`_whiten`), not their common level,
which the constants are there to set: a fit that took the differences as exact to their 2% run noise
spent three runs on bending secondary constants to that scatter, and predicted the group's other
runs worse than the a-priori model (one k-shot group went from 7.8% to 11.2% MAPE). With it, a few
runs fix the level and the shape constants move only as far as runs that differ in what they stress
support; the runs' own residuals then update it (`_time_sigma`)."""
TIME_SIGMA_REL = float(np.hypot(RUN_NOISE_REL, MODEL_DISCREPANCY_REL))
"""The prior spread of the differences between runs about the model's: run noise and model
discrepancy, independent."""
MEMORY_NOISE_REL = 0.05
"""The same for a measured peak memory (allocator state differs from run to run by a few %)."""
IDENTIFIED_VARIANCE_RATIO = 0.5
"""A parameter counts as fitted when the runs at least halve its prior variance (posterior / prior
variance <= this, from the Gauss-Newton covariance of the regularised fit); otherwise it stays at
its prior and is reported as not fitted."""
ROBUST_SCALE = 3.0
"""Residuals beyond this many noise units (3 x 9.2% = 28% for a run) count linearly, not squared: a
measured run that the modelled physics cannot explain (an allocator thrashing near the memory limit,
a straggler node) must not drag every constant to explain it. Priors stay quadratic."""


def _robust(r: np.ndarray) -> np.ndarray:
    """Residuals whose squares are scipy's "soft_l1" loss at scale `ROBUST_SCALE` (sign kept)."""
    c = ROBUST_SCALE
    return np.sign(r) * c * np.sqrt(2.0 * (np.sqrt(1.0 + (r / c) ** 2) - 1.0))
LOO_BAND_QUANTILE = 0.9
"""The uncertainty band a calibrated profile claims: this quantile of the leave-one-out errors."""
MIN_BAND = 0.02
BAND_Z = NormalDist().inv_cdf(0.5 + LOO_BAND_QUANTILE / 2.0)
"""Run-to-run scatter units in the band: the two-sided `LOO_BAND_QUANTILE` quantile of a normal
(1.645 for 90%), so the scatter term covers the same share of runs as the leave-one-out term."""


def band_rel(loo_errors: np.ndarray, *, run_scatter_rel: float, mape_after: float) -> float:
    """The band a later prediction claims for one measured run (median of its steady steps).

    Two independent parts, added in quadrature: the model's error on runs it was not fitted to (the
    `LOO_BAND_QUANTILE` of the leave-one-out errors, which already holds the noise of the runs it
    was scored against), and the new run's own run-to-run scatter (`run_scatter_rel`, the relative
    standard deviation measured on this machine, `pooled_run_scatter_rel`) at the same coverage
    (`BAND_Z`). A band from the leave-one-out errors alone says how well the model knows the
    layout's typical time, not how far one more run of it may land: on a machine whose runs scatter
    by 25% it claimed +/-30% and the next run fell 45% away. Never below the in-sample error."""
    loo = float(np.quantile(loo_errors, LOO_BAND_QUANTILE)) if len(loo_errors) else 0.0
    return float(max(np.hypot(loo, BAND_Z * max(run_scatter_rel, 0.0)), mape_after, MIN_BAND))


def measured_range_s(predicted_s: float, band_rel: float) -> tuple[float, float]:
    """The measured step times a prediction's band admits. The band bounds the error relative to
    the measured time, |predicted - measured| / measured <= band (how the leave-one-out errors and
    the run scatter are measured), so the range is [predicted / (1 + band), predicted / (1 - band)],
    not predicted x (1 +/- band): a prediction of 47 ms at +/-59% admits 30-115 ms. Unbounded above
    when the band reaches 100%."""
    upper = predicted_s / (1.0 - band_rel) if band_rel < 1.0 else float("inf")
    return predicted_s / (1.0 + band_rel), upper


def pooled_run_scatter_rel(times_by_plan: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The relative run-to-run scatter of one run's time, from repeated runs of the same plans:
    the pooled standard deviation of log(time) about each plan's mean (unbiased, ddof 1 per plan),
    and its degrees of freedom. Plans measured once say nothing about it; None when no plan was run
    twice. Log time, so a plan that takes 10x longer weighs the same as a fast one."""
    squares, dof = 0.0, 0
    for times in times_by_plan:
        t = np.log(np.asarray([float(x) for x in times if x and x > 0], dtype=float))
        if len(t) >= 2:
            squares += float(np.sum((t - t.mean()) ** 2))
            dof += len(t) - 1
    if dof == 0:
        return None
    return float(np.sqrt(squares / dof)), dof


@dataclass(frozen=True, kw_only=True)
class Run:
    """One measured run: the model, cluster and plan it ran, its measured step time and, optionally,
    peak memory. `trainings` x `plans` are the candidates when a source leaves options unstated
    (the median over those that fit is the prediction, as `validation.scoring` scores them); a run
    the user states fully has one of each."""

    model: Model
    cluster: Cluster
    trainings: tuple[Training, ...]
    plans: tuple[Plan, ...]
    measured_s: float
    peak_memory_gib: float | None = None

    @classmethod
    def stated(cls, *, model: Model, cluster: Cluster, training: Training, plan: Plan, measured_s: float,
               peak_memory_gib: float | None = None) -> Run:
        return cls(model=model, cluster=cluster, trainings=(training,), plans=(plan,), measured_s=measured_s,
                   peak_memory_gib=peak_memory_gib)


@dataclass(frozen=True, kw_only=True)
class ParameterFit:
    name: str
    value: float
    prior: float
    fitted: bool
    unit: str
    variance_ratio: float
    """Posterior / prior variance (1: the runs say nothing about it)."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What a calibration found: every parameter (value, prior, fitted), the runs before and after,
    and the leave-one-out error (each run predicted by a calibration on the others)."""

    parameters: dict[str, ParameterFit]
    measured_s: np.ndarray
    predicted_before_s: np.ndarray
    predicted_after_s: np.ndarray
    loo_errors: np.ndarray
    memory_measured_gib: np.ndarray
    memory_before_gib: np.ndarray
    memory_after_gib: np.ndarray
    run_scatter_rel: float = 0.0
    """Measured relative run-to-run scatter of one run on this cluster (0: not measured); the band
    adds it to the leave-one-out error (`band_rel`)."""

    @property
    def constants(self) -> dict[str, float]:
        """The fitted parameters' values (those not fitted stay out: their prior is the preset's)."""
        return {name: p.value for name, p in self.parameters.items() if p.fitted}

    @property
    def mape_before(self) -> float:
        return float(np.mean(np.abs(self.predicted_before_s - self.measured_s) / self.measured_s))

    @property
    def mape_after(self) -> float:
        return float(np.mean(np.abs(self.predicted_after_s - self.measured_s) / self.measured_s))

    @property
    def loo_mape(self) -> float:
        return float(np.mean(self.loo_errors))

    @property
    def uncertainty_rel(self) -> float:
        """The band later predictions claim: the `LOO_BAND_QUANTILE` of the leave-one-out errors
        combined with the measured run-to-run scatter (`band_rel`)."""
        return band_rel(self.loo_errors, run_scatter_rel=self.run_scatter_rel, mape_after=self.mape_after)

    def profile(self, base: Profile | None = None, *, profile_id: str = "") -> Profile:
        """A profile that carries the constants (`perfmodels.steptime` applies them), source
        "calibrated", with the leave-one-out band."""
        base = base or Profile()
        return replace(base, profile_id=profile_id or base.profile_id, corrections=(), source="calibrated",
                       uncertainty_rel=self.uncertainty_rel, constants=tuple(sorted(self.constants.items())),
                       run_scatter_rel=self.run_scatter_rel or None)


@dataclass(frozen=True)
class _Block:
    """Plans of some runs that one vectorised prediction scores: same model, cluster, training and
    placement order."""

    model: Model
    cluster: Cluster
    training: Training
    arrays: PlanArrays
    run_of_plan: np.ndarray


def _blocks(runs: Sequence[Run]) -> list[_Block]:
    """Group every valid candidate of every run into blocks; ValueError names a run none is valid for."""
    groups: dict[tuple[int, int, int, tuple[str, ...]], list[tuple[int, Plan]]] = {}
    keep: dict[tuple[int, int, int, tuple[str, ...]], tuple[Model, Cluster, Training]] = {}
    for i, run in enumerate(runs):
        t = run.measured_s
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and np.isfinite(t) and t > 0):
            raise ValueError(f"runs[{i}].iteration_time_s must be a positive number, got {run.measured_s!r}")
        problems: list[str] = []
        valid = 0
        cluster = _strip_constants(run.cluster)
        for training in run.trainings:
            for plan in run.plans:
                why = combination_problems(run.model, cluster, training, plan)
                if why:
                    problems.extend(why)
                    continue
                key = _group_key(run.model, cluster, training, plan.order)
                keep[key] = (run.model, cluster, training)
                groups.setdefault(key, []).append((i, plan))
                valid += 1
        if not valid:
            raise ValueError(f"runs[{i}].plan: {problems[0] if problems else 'no plan'}")
    out = []
    for key, items in groups.items():
        model, cluster, training = keep[key]
        out.append(_Block(model=model, cluster=cluster, training=training,
                          arrays=from_plans([p for _, p in items]),
                          run_of_plan=np.array([i for i, _ in items])))
    return out


def _group_key(model: Model, cluster: Cluster, training: Training, order: tuple[str, ...]) -> object:
    """Runs of equal specs share one vectorised prediction (by value; by identity when a spec is
    not hashable)."""
    try:
        key = (model, cluster, training, order)
        hash(key)
        return key
    except TypeError:
        return (id(model), id(cluster), id(training), order)


def _strip_constants(cluster: Cluster) -> Cluster:
    prof = cluster.profile
    if prof is None or not (prof.constants or prof.corrections):
        return cluster
    return replace(cluster, profile=replace(prof, constants=(), corrections=(), source="profile"))


def _evaluate(blocks: Sequence[_Block], n: int, constants: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(predicted step s, predicted peak GiB) per run: the median over its candidates that fit in
    memory (all of them when none fits)."""
    times: list[list[float]] = [[] for _ in range(n)]
    mems: list[list[float]] = [[] for _ in range(n)]
    fits: list[list[bool]] = [[] for _ in range(n)]
    for b in blocks:
        cluster, training = apply_constants(b.cluster, b.training, constants)
        pred = predict_many(b.model, cluster, training, b.arrays)
        cap = float(np.max(pred.memory.capacity_gib))
        for j, i in enumerate(b.run_of_plan):
            times[i].append(float(pred.iteration_time_s[j]))
            mems[i].append(float(pred.memory.total_gib[j]))
            fits[i].append(bool(pred.memory.total_gib[j] <= cap))
    t_out, m_out = np.empty(n), np.empty(n)
    for i in range(n):
        t, m, f = np.array(times[i]), np.array(mems[i]), np.array(fits[i])
        pool = f if f.any() else np.ones_like(f)
        t_out[i], m_out[i] = np.median(t[pool]), np.median(m[pool])
    return t_out, m_out


class _Space:
    """The fit's coordinates: z = 0 at the prior, unit prior spread, bounded by the plausible range."""

    def __init__(self, prior: dict[str, float], names: Sequence[str],
                 table: Mapping[str, Parameter] = BY_NAME) -> None:
        self.prior = prior
        self.names = list(names)
        self.params = [table[n] for n in self.names]

    def values(self, z: np.ndarray) -> dict[str, float]:
        out = dict(self.prior)
        for p, zi in zip(self.params, z, strict=True):
            x0 = self.prior[p.name]
            x = x0 * np.exp(p.sigma * zi) if p.scale == "log" else x0 + p.sigma * zi
            out[p.name] = float(min(max(x, p.lower), p.upper))
        return out

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = [], []
        for p in self.params:
            x0 = self.prior[p.name]
            if p.scale == "log":
                lo.append(np.log(p.lower / x0) / p.sigma)
                hi.append(np.log(p.upper / x0) / p.sigma)
            else:
                lo.append((p.lower - x0) / p.sigma)
                hi.append((p.upper - x0) / p.sigma)
        return np.array(lo) - 1e-12, np.array(hi) + 1e-12


def _solve(blocks: Sequence[_Block], runs: Sequence[Run], prior: dict[str, float],
           names: Sequence[str], table: Mapping[str, Parameter] = BY_NAME,
           time_sigma: float = TIME_SIGMA_REL) -> tuple[dict[str, float], dict[str, float]]:
    """Regularised least squares over `names`: (values, posterior/prior variance ratio per name)."""
    n = len(runs)
    if not names or n == 0:
        return dict(prior), {name: 1.0 for name in names}
    y = np.array([float(r.measured_s) for r in runs])
    mem_idx = np.array([i for i, r in enumerate(runs) if r.peak_memory_gib])
    y_mem = np.array([float(runs[i].peak_memory_gib or 0.0) for i in mem_idx])
    space = _Space(prior, names, table)

    def residuals(z: np.ndarray) -> np.ndarray:
        t, m = _evaluate(blocks, n, space.values(z))
        # log ratios: relative errors when small, and a misfit of 10x weighs as one of 1/10x
        r_time = _whiten(np.log(t / y), time_sigma)
        r_mem = np.log(m[mem_idx] / y_mem) / MEMORY_NOISE_REL if len(mem_idx) else np.zeros(0)
        return np.concatenate([_robust(r_time), _robust(r_mem), z])

    lo, hi = space.bounds()
    z0 = np.clip(np.zeros(len(names)), lo + 0.05, hi - 0.05)  # strictly inside: trf scales by the distance
    # imported here: scipy.optimize costs ~0.5 s, and `gridtune recommend` (tuner.trials reads
    # RUN_NOISE_REL) imports this module without fitting anything
    from scipy.optimize import least_squares

    sol = least_squares(residuals, z0, bounds=(lo, hi), method="trf", diff_step=1e-4, x_scale=1.0,
                        xtol=1e-6, ftol=1e-8, max_nfev=40 * (len(names) + 1))
    J = np.asarray(sol.jac)
    try:
        cov = np.linalg.inv(J.T @ J)
        ratio = np.clip(np.diag(cov), 0.0, 1.0)
    except np.linalg.LinAlgError:
        ratio = np.ones(len(names))
    return space.values(sol.x), dict(zip(names, (float(v) for v in ratio), strict=True))


def _data_jacobian(blocks: Sequence[_Block], runs: Sequence[Run], at: dict[str, float],
                   base: dict[str, float] | None = None, table: Mapping[str, Parameter] = BY_NAME,
                   time_sigma: float = TIME_SIGMA_REL) -> np.ndarray:
    """Weighted residuals' derivative in each parameter's prior units at the values `at` (runs x
    PARAMETERS; memory rows after the time rows), by a forward difference of a twentieth of a
    prior spread (inward at a bound). `base`: the priors that define the units (default `at`)."""
    prior = at
    n = len(runs)
    mem_idx = [i for i, r in enumerate(runs) if r.peak_memory_gib]

    def weighted(t: np.ndarray, m: np.ndarray) -> np.ndarray:
        y = np.array([float(r.measured_s) for r in runs])
        y_mem = np.array([float(runs[i].peak_memory_gib or 0.0) for i in mem_idx])
        mem = np.log(m[mem_idx] / y_mem) / MEMORY_NOISE_REL if mem_idx else np.zeros(0)
        return np.concatenate([_whiten(np.log(t / y), time_sigma), mem])

    units = base or at
    here = weighted(*_evaluate(blocks, n, prior))
    cols = []
    for p in (table[q.name] for q in PARAMETERS):
        space = _Space(units, [p.name], table)
        z_here = _z_of(p, units[p.name], prior[p.name])
        step = 0.05 if space.bounds()[1][0] > z_here + 0.05 else -0.05
        moved = {**prior, **space.values(np.array([z_here + step]))}
        moved = {k: (moved[k] if k == p.name else prior[k]) for k in prior}
        cols.append((weighted(*_evaluate(blocks, n, moved)) - here) / step)
    return np.array(cols).T


def _z_of(p: Parameter, x0: float, x: float) -> float:
    """The prior-unit coordinate of value `x` for a parameter whose prior is `x0`."""
    if p.scale == "log":
        return float(np.log(x / x0) / p.sigma)
    return float((x - x0) / p.sigma)


def _identified(J: np.ndarray) -> list[str]:
    """Greedy choice of what the runs identify: parameters in order of their effect (column norm),
    each kept when, fitted together with those kept before, every one of them still has its prior
    variance at least halved (linearised posterior, unit priors). One run thus fixes the dominant
    parameter alone; more runs, and runs that differ in what they stress, admit more."""
    norms = np.linalg.norm(J, axis=0)
    kept: list[int] = []
    for j in np.argsort(-norms):
        if norms[j] < 1e-6:
            break
        trial = [*kept, int(j)]
        Js = J[:, trial]
        cov = np.linalg.inv(np.eye(len(trial)) + Js.T @ Js)
        if np.all(np.diag(cov) <= IDENTIFIED_VARIANCE_RATIO):
            kept = trial
    return [PARAMETERS[j].name for j in sorted(kept)]


def parameter_table(cluster: Cluster) -> dict[str, Parameter]:
    """The parameters with their prior spreads for this cluster: as listed for a GPU, whose presets
    are checked against published runs; wider for a CPU "device", whose preset is an
    order-of-magnitude guess (spreads x `UNCERTAINTY_CPU_PRESET / UNCERTAINTY_PRESET`, the ratio of
    the bands `perfmodels.steptime` claims for the two)."""
    if cluster.gpu.vendor != "cpu":
        return dict(BY_NAME)
    widen = UNCERTAINTY_CPU_PRESET / UNCERTAINTY_PRESET
    return {p.name: replace(p, sigma=p.sigma * widen) for p in PARAMETERS}


def fit_constants(runs: Sequence[Run], *, prior: dict[str, float] | None = None,
                  ) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """The regularised fit: (every parameter's value, posterior/prior variance ratios, the fitted names).
    `_fit_runs` says how; this drops the residual spread it settled on."""
    values, ratios, fitted, _ = _fit_runs(runs, prior=prior)
    return values, ratios, fitted


DISCREPANCY_PRIOR_RUNS = 1.0
"""How many runs' worth of evidence `MODEL_DISCREPANCY_REL` counts for when the runs' own residuals
update it (`_time_sigma`): one run's worth, so that a dozen runs the model explains closely bring the spread
down to their run noise, while three runs with their fitted level leave most of it."""
DISCREPANCY_ROUNDS = 4


def _fit_runs(runs: Sequence[Run], *, prior: dict[str, float] | None = None,
         ) -> tuple[dict[str, float], dict[str, float], list[str], float]:
    """(values, variance ratios, fitted names, the time residuals' relative spread used).

    At a given residual spread, three passes: every parameter the runs move at all (`_data_jacobian`)
    is fitted by bounded least squares with its prior as a residual; at that solution, where the
    physics is no longer the prior's (a bandwidth that the runs say is 10x lower has 10x the effect),
    `_identified` keeps the parameters the runs pin down; those are refitted with every other
    parameter exactly at its prior.

    The runs' common level weighs at the run noise; their differences at a spread that starts at
    `TIME_SIGMA_REL` (run noise and the model's typical discrepancy) and is updated from the fit's
    contrasts, with their degrees of freedom against `DISCREPANCY_PRIOR_RUNS` runs of the prior
    spread (the conjugate update of a normal variance), then refitted, at most
    `DISCREPANCY_ROUNDS` times. Runs the model explains closely
    (a user's stack whose only differences are its constants) are then trusted to their run noise
    and recover those constants; a few runs, or runs with structure the physics lacks, keep the
    spread wide, so secondary constants are not bent to fit that structure."""
    if not runs:
        raise ValueError("runs: give at least one measured run")
    blocks = _blocks(runs)
    prior = prior or priors(_strip_constants(runs[0].cluster), runs[0].trainings[0])
    table = parameter_table(runs[0].cluster)
    sigma = TIME_SIGMA_REL
    for _ in range(DISCREPANCY_ROUNDS):
        J0 = _data_jacobian(blocks, runs, prior, table=table, time_sigma=sigma)
        moving = [p.name for k, p in enumerate(PARAMETERS) if np.linalg.norm(J0[:, k]) > 1e-6]
        first, _ = _solve(blocks, runs, prior, moving, table, time_sigma=sigma)
        J = _data_jacobian(blocks, runs, first, base=prior, table=table, time_sigma=sigma)
        fitted = _identified(J)
        values, ratio = _solve(blocks, runs, prior, fitted, table, time_sigma=sigma)
        updated = _time_sigma(blocks, runs, values, len(fitted))
        if abs(updated - sigma) <= 0.1 * sigma:
            break
        sigma = updated
    ratios = {p.name: float(np.clip(1.0 / (1.0 + np.sum(J[:, k] ** 2)), 0.0, 1.0))
              for k, p in enumerate(PARAMETERS)}  # alone, linearised at the first solution
    ratios.update(ratio)
    return values, ratios, fitted, sigma


def _whiten(log_ratio: np.ndarray, within_sigma: float) -> np.ndarray:
    """Time residuals in noise units: their mean (the level the runs share, which the constants set:
    known to the run noise over sqrt(n) runs), then their n - 1 orthonormal contrasts (the differences
    between runs, where the model's discrepancy lives: `within_sigma`)."""
    n = len(log_ratio)
    level = np.sqrt(n) * np.mean(log_ratio) / RUN_NOISE_REL
    if n == 1:
        return np.array([level])
    return np.concatenate([[level], _contrasts(n).T @ log_ratio / within_sigma])


_CONTRASTS: dict[int, np.ndarray] = {}


def _contrasts(n: int) -> np.ndarray:
    """(n, n - 1) orthonormal columns orthogonal to the all-ones vector (cached per n)."""
    if n not in _CONTRASTS:
        q, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
        _CONTRASTS[n] = q[:, 1:]
    return _CONTRASTS[n]


def _time_sigma(blocks: Sequence[_Block], runs: Sequence[Run], values: dict[str, float],
                fitted: int) -> float:
    """The spread of the differences between runs after a fit: the prior spread `TIME_SIGMA_REL` as
    `DISCREPANCY_PRIOR_RUNS` observations plus the fit's squared contrasts over their degrees of
    freedom (n - 1 contrasts less the fitted constants beyond the first, which sets the level; never
    below the run noise)."""
    t, _ = _evaluate(blocks, len(runs), values)
    y = np.array([float(r.measured_s) for r in runs])
    if len(runs) < 2:
        return TIME_SIGMA_REL
    squares = float(np.sum((_contrasts(len(runs)).T @ np.log(t / y)) ** 2))
    dof = max(len(runs) - 1 - max(fitted - 1, 0), 0)
    nu = DISCREPANCY_PRIOR_RUNS
    return float(max(np.sqrt((nu * TIME_SIGMA_REL**2 + squares) / (nu + dof)), RUN_NOISE_REL))


def predict_runs(runs: Sequence[Run], constants: Mapping[str, float] | None = None,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(step s, peak GiB) the model predicts for each run with `constants` (None: the priors), each
    the median over the run's candidates that fit, as the fit sees them."""
    return _evaluate(_blocks(runs), len(runs), dict(constants or {}))


def calibrate_runs(runs: Sequence[Run], *, loo: bool = True, loo_max: int = 30,
                   run_scatter_rel: float = 0.0) -> Calibration:
    """Fit the physical constants (`perfmodels.constants.PARAMETERS`) of the runs' stack on their
    cluster, and score the result by leave-one-out. `run_scatter_rel`: the measured run-to-run
    scatter of one run on this cluster, which the band adds (`band_rel`; 0 when not measured).

    The runs may use different models, batches and layouts; they must share the cluster's GPU type.
    The priors are those of the first run's cluster and training (the stack). Leave-one-out: each of
    the first `loo_max` runs predicted by a fit on the others (with one run, by the priors alone)."""
    if not runs:
        raise ValueError("runs: give at least one measured run")
    gpu = runs[0].cluster.gpu.name
    for i, run in enumerate(runs):
        if run.cluster.gpu.name != gpu:
            raise ValueError(f"runs[{i}].cluster.gpu: {run.cluster.gpu.name!r} differs from runs[0]'s "
                             f"{gpu!r}; calibrate one GPU type at a time")
    blocks = _blocks(runs)
    n = len(runs)
    prior = priors(_strip_constants(runs[0].cluster), runs[0].trainings[0])
    values, ratios, fitted, sigma = _fit_runs(runs, prior=prior)
    before_t, before_m = _evaluate(blocks, n, prior)
    after_t, after_m = _evaluate(blocks, n, {k: values[k] for k in fitted} | {
        k: v for k, v in prior.items() if k not in fitted})
    y = np.array([float(r.measured_s) for r in runs])
    errors = []
    if loo:
        for i in range(min(n, loo_max)):
            others = [r for j, r in enumerate(runs) if j != i]
            held = _blocks([runs[i]])
            if others:
                # the constants the whole fit identified, refitted without this run
                vals, _ = _solve(_blocks(others), others, prior, fitted, parameter_table(runs[0].cluster),
                                 time_sigma=sigma)
                use = {k: (vals[k] if k in fitted else prior[k]) for k in prior}
            else:
                use = prior
            t, _ = _evaluate(held, 1, use)
            errors.append(abs(float(t[0]) - y[i]) / y[i])
    mem = np.array([float(r.peak_memory_gib) if r.peak_memory_gib else np.nan for r in runs])
    params = {
        p.name: ParameterFit(name=p.name, value=float(values[p.name]) if p.name in fitted else prior[p.name],
                             prior=prior[p.name], fitted=p.name in fitted, unit=p.unit,
                             variance_ratio=float(ratios[p.name]))
        for p in PARAMETERS
    }
    loo_errors = np.array(errors) if errors else np.abs(after_t - y) / y
    return Calibration(parameters=params, measured_s=y, predicted_before_s=before_t,
                       predicted_after_s=after_t, loo_errors=loo_errors,
                       memory_measured_gib=mem, memory_before_gib=before_m, memory_after_gib=after_m,
                       run_scatter_rel=float(max(run_scatter_rel, 0.0)))
