"""POST /v1/predict and POST /v1/recommend: the performance model and the layout search over HTTP."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response
from starlette.concurrency import run_in_threadpool

from api import examples, schemas, service
from api.deps import ProfilesDep, SettingsDep
from api.searches import SearchRunner

router = APIRouter(prefix="/v1", tags=["model"])
JSON = "application/json"
INLINE_LAYERS = 32
"""Predictions of models with more explicit layers than this run in a worker thread."""

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": schemas.ErrorOut, "description": "invalid input; each message names the field and value"},
    503: {"model": schemas.ErrorOut, "description": "busy or over the time budget; retry later"},
}


@router.post("/predict", response_model=schemas.PredictionOut, responses=ERRORS)
async def predict(
    body: Annotated[
        schemas.PredictRequest,
        Body(
            openapi_examples={
                "gpt3-175b on 1,024 A100s": {"value": examples.PREDICT},
                "llama3-8b shape on 64 H100s": {"value": examples.PREDICT_EXPLICIT},
            }
        ),
    ],
    request: Request,
    profiles: ProfilesDep,
) -> Any:
    """Predicted step time, throughput, memory and time breakdown of one plan.

    With `cluster.profile_id`, the stored profile's fitted constants are used; the response's
    `constants_source` and `profile_id` say which constants produced the numbers.
    """
    cache = request.app.state.cache
    if body.model.layers and len(body.model.layers) > INLINE_LAYERS:
        # a long explicit layer list costs ~0.2 ms per layer: off the event loop
        data = await run_in_threadpool(service.predict_cached, body, profiles, cache)
    else:
        # a transformer prediction takes about a millisecond; a thread hop would cost more
        data = service.predict_cached(body, profiles, cache)
    return Response(data, media_type=JSON)


@router.post("/recommend", response_model=schemas.RecommendOut, responses=ERRORS)
async def recommend(
    body: Annotated[
        schemas.RecommendRequest,
        Body(openapi_examples={"gpt3-175b on 1,024 A100s": {"value": examples.RECOMMEND}}),
    ],
    request: Request,
    profiles: ProfilesDep,
    settings: SettingsDep,
) -> Any:
    """The best layouts, ranked, with predictions and the reasons others were pruned.

    The search runs in a warm worker process under a time budget (`search.time_budget_s`, capped by
    the server; the worker is killed and replaced, and the answer is a 503, when it overruns), one per
    server CPU at a time; clusters above the server's GPU bound get a 422. Repeated questions are
    answered from a cache.
    """
    job = service.prepare_recommend(body, profiles, settings)
    runner: SearchRunner = request.app.state.search_runner
    return Response(await runner.run(job), media_type=JSON)
