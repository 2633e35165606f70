"""The workspace service and what runs around it: provider selection and fallback, warm pools, health checks,
reconciliation at start-up, the reaper, disk watching and path confinement. Everything above it (API, agents, tools)
reaches workspaces through :class:`~corral.orchestrator.service.WorkspaceService`."""
