"""The web console that ``corral serve`` answers at ``/``: static pages over Corral's own JSON API.

The pages are plain files (``static/``: HTML, CSS and ES modules, no build step) and carry no data. The browser keeps
the API token in ``sessionStorage`` and sends it as ``Authorization: Bearer`` to the same API the CLI and SDK use
(and, for the terminal, in the PTY WebSocket's subprotocol list, since a browser cannot set headers there). The
routes here are therefore public and serve files only, each by an allow-list.
"""

from corral.console.routes import VENDOR_FILES, console_router

__all__ = ["VENDOR_FILES", "console_router"]
