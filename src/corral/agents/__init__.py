"""Agent types and their sessions: the workspace each type declares, the repository checked out into it, and the
session lifecycle that provisions it before the agent starts."""
