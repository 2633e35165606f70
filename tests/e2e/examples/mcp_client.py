import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(agent_type_id: str) -> None:
    server = StdioServerParameters(
        command="corral",
        args=["mcp", "--agent-type", agent_type_id],  # or ["mcp", "--session", SESSION_ID]
        env={name: value for name, value in os.environ.items() if name.startswith("CORRAL_")},  # whichever are set
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        print([tool.name for tool in (await mcp.list_tools()).tools])  # ['bash', 'read']
        result = await mcp.call_tool("bash", {"command": "echo hi > greeting.txt && cat greeting.txt"})
        print(result.content[0].text)  # hi
        refused = await mcp.call_tool("write", {"path": "x.txt", "content": "x"})
        print(refused.is_error, refused.content[0].text)  # True Tool 'write' is not enabled for this agent type


asyncio.run(main(sys.argv[1]))
