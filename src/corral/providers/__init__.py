"""Workspace providers: the contract (:mod:`~corral.providers.base`), one module per backend (``docker``,
``gvisor``, ``firecracker``, ``e2b``, ``http``, ``fake``) and the registry that maps a provider name to its lazy
import (:mod:`~corral.providers.registry`)."""
