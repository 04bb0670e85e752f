"""gridtune's REST service (FastAPI). Built under issue 4."""
