"""Validation of the performance model against published training runs (tooling, not the model).

`validation.loader` reads the CSVs in `validation/data` (or any file in the same formats) into cases
whose stack is read only from explicit columns; `validation.scoring` predicts each case;
`validation.summary` computes the figures `bench/validate_published.py` prints:

    PYTHONPATH=. .venv/bin/python bench/validate_published.py [--csv more.csv] [--json] [--verbose]

The performance model (`perfmodels`) never imports this package.
"""
