"""gridtune's tuner: the layout search space, its constraints, vectorized ranking, the store of
profiles and measurements, and the `gridtune` command line. Never imports torch.

    import tuner
    rec = tuner.recommend(model, cluster, training, top_k=10)   # -> Recommendation
"""


def __getattr__(name: str):
    if name in ("recommend", "Recommendation", "SearchOptions"):
        from tuner import recommend as _rec

        return getattr(_rec, name)
    raise AttributeError(name)
