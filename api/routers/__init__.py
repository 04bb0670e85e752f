"""Thin routers: parse (pydantic), hand over to `api.service`, return plain dicts."""
