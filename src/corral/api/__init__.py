"""The HTTP API: :func:`~corral.api.app.create_app` builds the FastAPI application serving workspaces, agent types,
sessions and their tools under ``/api/v1``, with bearer-token auth and stable JSON error codes; :mod:`corral.api.e2b`
adds the E2B-compatible endpoints."""
