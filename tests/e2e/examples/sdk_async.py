import asyncio

from corral.client import AsyncCorral, ToolNotAllowedError


async def main() -> None:
    async with AsyncCorral() as corral:  # CORRAL_URL and CORRAL_API_TOKEN from the environment
        # A workspace on gVisor, destroyed when the block ends.
        async with await corral.workspaces.create(provider="gvisor") as ws:
            await ws.files.write("hello.py", "import platform\nprint('hello from', platform.system())\n")
            result = await ws.exec("python3 hello.py")
            print(result.exit_code, result.stdout.strip())  # 0 hello from Linux
            print([f.name for f in await ws.files.list()])  # ['hello.py']
            print(await ws.files.read("hello.py") == b"import platform\nprint('hello from', platform.system())\n")

        # An agent type whose sessions may read, write and search files, but not run commands.
        editor = await corral.agent_types.create(
            "editor", workspace={"enabled": True, "tools": ["read", "write", "grep"]}
        )
        async with await corral.sessions.start(editor.id, wait=True) as session:
            await session.tools.write("src/app.py", "TODO = 'ship it'\n")
            found = await session.tools.grep("TODO")
            print([(m.path, m.line_number) for m in found.matches])  # [('src/app.py', 1)]
            try:
                await session.tools.bash("ls")
            except ToolNotAllowedError as exc:
                print(exc)  # Tool 'bash' is not enabled for this agent type
            print([(e.tool, e.status) for e in await session.audit()])  # [..., ('bash', 'refused')]
        # Its session has ended, so the type can go (with that session's record): a second run starts afresh.
        await corral.agent_types.delete(editor.id)


asyncio.run(main())
