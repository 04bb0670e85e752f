"""Profile files: the fitted profile JSON, the raw rows CSV, provenance, and upload to the service.

Why: a profile is only worth something if one can tell where it came from and re-fit it later.
`gridtune profile --out my-cluster.json` writes

- `my-cluster.json`: `perfmodels.io.profile_to_dict(Profile)` (what predictions use) plus
  "provenance" (date, hosts, torch/NCCL versions, backend, world size), "fits" (every alpha-beta
  fit with R^2, hold-out error and point counts), "expected" (measured vs preset bus bandwidth and
  their ratio) and "holdout_median_abs_error";
- `my-cluster.rows.csv`: the tidy raw rows (op, bytes, group_size, level, members_per_node, trial,
  seconds, host, torch_version, backend, nccl_version, then m, n, k, dtype for GEMM/copy rows, and
  the printed nccl-tests columns for imported rows).

    from tuner.profiles import read_profile
    profile, doc = read_profile("my-cluster.json")       # Profile for perfmodels.predict

Never imports torch. pandas is imported by the functions on rows (the fits import theirs too):
reading and applying a profile, all `gridtune recommend --profile` and the service do, needs neither.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfmodels import fitting
from perfmodels.io import cluster_to_dict, json_safe, profile_from_dict, profile_to_dict
from perfmodels.specs import Cluster, Profile
from tuner.service_client import (
    post_json,
)

if TYPE_CHECKING:
    import pandas as pd

_DOC_EXTRAS = ("provenance", "fits", "expected")


def rows_path_for(profile_path: str | os.PathLike[str]) -> Path:
    """`cluster.json` -> `cluster.rows.csv` (same folder)."""
    p = Path(profile_path)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(f"{stem}.rows.csv")


def tidy_rows(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows with the RAW_COLUMNS first (missing ones empty), then whatever else they carry."""
    import pandas as pd  # lazy (module docstring)

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    for col in fitting.RAW_COLUMNS:
        if col not in df:
            df[col] = ""
    extra = [c for c in df.columns if c not in fitting.RAW_COLUMNS]
    return df[[*fitting.RAW_COLUMNS, *extra]]


def write_rows(path: str | os.PathLike[str], rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tidy_rows(rows).to_csv(path, index=False)
    return path


def read_rows(path: str | os.PathLike[str]) -> pd.DataFrame:
    import pandas as pd  # lazy (module docstring)

    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def import_provenance(rows: pd.DataFrame, files: Sequence[str]) -> dict[str, Any]:
    """Provenance of rows imported from nccl-tests files."""
    import pandas as pd  # lazy (module docstring)

    hosts: list[str] = []
    for h in rows.get("host", pd.Series(dtype=str)).astype(str):
        hosts += [x for x in h.split(",") if x and x not in hosts]
    versions = sorted(
        {v for v in rows.get("nccl_version", pd.Series(dtype=str)).astype(str) if v and v != "nan"}
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hosts": hosts, "torch_version": "", "nccl_version": ",".join(versions), "backend": "nccl",
        "world_size": int(pd.to_numeric(rows["group_size"]).max()) if len(rows) else 0,
        "source": "nccl-tests", "files": [os.path.basename(str(f)) for f in files],
    }


def build_document(rows: pd.DataFrame, *, provenance: Mapping[str, Any], cluster: Cluster | None = None,
                   name: str = "") -> dict[str, Any]:
    """Fit everything in `rows` and assemble the profile JSON document."""
    rows = tidy_rows(rows)
    fits, holdout = fitting.fit_collectives(rows)
    gemm = fitting.fit_gemm_rows(rows)
    hbm = fitting.memory_bandwidth_GBps(rows)
    date = str(provenance.get("date", ""))
    profile = fitting.build_profile(fits, gemm=gemm, hbm_bandwidth_GBps=hbm,
                                    profile_id=name or f"profile-{date[:19].replace(':', '')}")
    expected = fitting.expected_table(fits, cluster)
    overall = fitting.overall_holdout_error(holdout)
    prov = dict(provenance)
    prov["holdout_median_abs_error"] = overall
    if cluster is not None:
        prov["expected_from_cluster"] = cluster.name
    if gemm is not None:
        prov["gemm_fit"] = {
            "r2": gemm.r2,
            "median_abs_error": gemm.median_abs_error,
            "n_points": gemm.n_points,
        }
    doc = profile_to_dict(profile)
    doc["provenance"] = prov
    doc["fits"] = fits.to_dict(orient="records")
    doc["expected"] = expected.to_dict(orient="records")
    doc["holdout_median_abs_error"] = overall
    return json_safe(doc)


def _profile_and_extras(doc: Mapping[str, Any]) -> tuple[Profile, dict[str, Any]]:
    """Parse with perfmodels.io; keys it does not (yet) accept are returned apart."""
    allowed = {f.name for f in dataclasses.fields(Profile)} | set(_DOC_EXTRAS)
    try:
        return profile_from_dict(doc), {}
    except ValueError:
        extras = {k: v for k, v in doc.items() if k not in allowed}
        if not extras:
            raise
        return profile_from_dict({k: v for k, v in doc.items() if k in allowed}), extras


def write_profile(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _profile_and_extras(doc)  # never write a file that cannot be read back
    path.write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    return path


def read_profile(path: str | os.PathLike[str]) -> tuple[Profile, dict[str, Any]]:
    """(Profile, the whole JSON document) of a profile file; ValueError names a bad file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read profile {str(path)!r}: {exc}") from None
    profile, _ = _profile_and_extras(doc)
    return profile, doc


def service_profile(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document as the service's profile parser accepts it.

    Top-level keys that `perfmodels.io.profile_from_dict` rejects (e.g. "holdout_median_abs_error"
    before it learns that key) move into "provenance", which it ignores, so nothing is lost.
    """
    _, extras = _profile_and_extras(doc)
    out = {k: v for k, v in doc.items() if k not in extras and v is not None}  # None = the default
    if extras:
        out["provenance"] = {**dict(doc.get("provenance") or {}), **extras}
    return out


def service_cluster(cluster: Cluster) -> dict[str, Any]:
    """The cluster for the service: its preset name plus the sizes, else every field."""
    from perfmodels import presets

    try:
        base = presets.cluster(cluster.name)
    except ValueError:
        return {k: v for k, v in json_safe(cluster_to_dict(cluster)).items() if v is not None}
    out: dict[str, Any] = {"preset": cluster.name, "num_gpus": cluster.num_gpus}
    if cluster.gpus_per_node != base.gpus_per_node:
        out["gpus_per_node"] = cluster.gpus_per_node
    return out


def upload(url: str, doc: Mapping[str, Any], *, name: str, cluster: Cluster | None = None,
           api_key: str | None = None, timeout_s: float = 30.0, client: Any = None) -> dict[str, Any]:
    """POST {url}/v1/clusters with {"name", "cluster"?, "profile"}; Bearer auth from GRIDTUNE_API_KEY.

    Returns the service's JSON answer; raises ValueError with the status and body on failure.
    `client` (an httpx.Client, or FastAPI's TestClient in tests) replaces a fresh connection.
    """
    if not name:
        raise ValueError("--upload needs a name for the cluster: pass --name NAME")
    body: dict[str, Any] = {"name": name, "profile": service_profile(doc)}
    if cluster is not None:
        body["cluster"] = service_cluster(cluster)
    answer = post_json(
        url,
        "/v1/clusters",
        json_safe(body),
        what="upload to",
        api_key=api_key,
        timeout_s=timeout_s,
        client=client,
    )
    return dict(answer) if isinstance(answer, dict) else {"answer": answer}


_PEAK_FIELDS = (
    "peak_tflops_fp32",
    "peak_tflops_tf32",
    "peak_tflops_bf16",
    "peak_tflops_fp16",
    "peak_tflops_fp8",
)


def apply_profile(cluster: Cluster, profile: Profile | None) -> tuple[Cluster, list[str]]:
    """`cluster` with `profile` attached, and the GPU's peaks no lower than what the profile measured.

    Why: MFU is achieved TFLOP/s over the GPU's peak. When the profiled machine's GEMMs run faster
    than its preset claims (a CPU "device" measured at 0.188 TFLOP/s against a preset peak of 0.05),
    the preset peak is wrong, and a prediction would show an MFU above 100%. The peak follows the
    measurement: every peak below `gemm_tflops_max` is raised to it (the profile does not say which
    dtype it measured, so all of them). Returns the notes to show the user.
    """
    if profile is None:
        return cluster, []
    notes: list[str] = []
    measured = profile.gemm_tflops_max
    gpu = cluster.gpu
    if measured is not None and measured > 0:
        raised = {f: float(measured) for f in _PEAK_FIELDS if 0 < getattr(gpu, f) < measured}
        if raised:
            gpu = dataclasses.replace(gpu, **raised)
            names = ", ".join(f.removeprefix("peak_tflops_") for f in raised)
            notes.append(
                f"the profile measured GEMMs at {measured:.4g} TFLOP/s, above the {cluster.gpu.name} "
                "preset's "
                f"peak ({names}); the peak follows the measurement, so MFU stays <= 100%"
            )
    return dataclasses.replace(cluster, gpu=gpu, profile=profile), notes


def load_profile(ref: str | os.PathLike[str], *, database_url: str | None = None,
                 ) -> tuple[Profile, dict[str, Any]]:
    """`--profile NAME|FILE`: (Profile, its document) from a JSON file when `ref` names one, else from
    the service store by id or name (`GRIDTUNE_DATABASE_URL`, else the default SQLite file): a
    `gridtune profile` file or a calibration (`gridtune calibrate`, `POST /v1/calibrations`)."""
    path = Path(ref)
    if path.is_file():
        return read_profile(path)
    from tuner.store import Store

    store = Store(database_url)
    try:
        stored = store.get_profile(str(ref))
    finally:
        store.close()
    if stored is None:
        raise ValueError(f"--profile {str(ref)!r} is neither a file nor a profile stored in the service "
                         "store (gridtune calibrate --name NAME or gridtune profile --upload store one)")
    profile, _ = _profile_and_extras(stored.profile)
    doc = dict(stored.profile)
    if stored.cluster and "calibration" in doc:
        doc["calibration"] = {**doc["calibration"], "cluster": stored.cluster}
    return dataclasses.replace(profile, profile_id=stored.id), doc
