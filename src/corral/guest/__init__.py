"""The guest agent protocol: the agent that runs inside every Docker, gVisor and Firecracker workspace
(:mod:`~corral.guest.agent`) and the host side that speaks to it (:mod:`~corral.guest.client`). The provider code built
on it is :mod:`corral.providers.agent_backed`."""
