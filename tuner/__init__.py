"""gridtune's tuner: the layout search space, its constraints, vectorized ranking, the store of
profiles and measurements, and the `gridtune` command line. Never imports torch.

    import tuner
    rec = tuner.recommend(model, cluster, training, top_k=10)   # -> Recommendation

The names below are loaded on first use (PEP 562), so that importing one submodule
(`tuner.catalog`, `tuner.aliases`, `tuner.store`, ...) does not import the search and the whole
cost model with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.search import recommend
    from tuner.types import Candidate, Recommendation, SearchOptions

_LAZY = {"recommend": "tuner.search", "Candidate": "tuner.types", "Recommendation": "tuner.types",
         "SearchOptions": "tuner.types"}

__all__ = ["Candidate", "Recommendation", "SearchOptions", "recommend"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups find it without coming here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
