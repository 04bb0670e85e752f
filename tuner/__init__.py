"""gridtune's tuner: the layout search space, its constraints, vectorized ranking, the store of
profiles and measurements, and the `gridtune` command line. Never imports torch.

    import tuner
    rec = tuner.recommend(model, cluster, training, top_k=10)   # -> Recommendation
"""

from tuner.search import recommend
from tuner.types import Candidate, Recommendation, SearchOptions

__all__ = ["Candidate", "Recommendation", "SearchOptions", "recommend"]
