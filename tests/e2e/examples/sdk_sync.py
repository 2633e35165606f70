from corral.client import Corral

with Corral() as corral, corral.workspaces.create() as ws:
    print(ws.exec(["echo", "same methods, no await"]).stdout, end="")
