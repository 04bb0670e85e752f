"""gridtune's REST service (FastAPI): predict, recommend, cluster profiles and measurements.

    from api import create_app          # create_app(settings=None) -> FastAPI
    gridtune serve --host 127.0.0.1 --port 8000

See api/app.py for the wiring and docs/architecture.md ("The path of one request") for the contracts.
"""

__version__ = "0.1.0"


def create_app(settings=None):  # re-exported lazily: `import api` stays light
    from api.app import create_app as _create_app

    return _create_app(settings)


__all__ = ["__version__", "create_app"]
