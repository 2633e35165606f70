# A workspace: create it, run commands (the exit code comes back), stop, resume, remove.
WS=$(corral workspaces create --provider gvisor)
corral workspaces exec "$WS" 'echo "hello from $(uname -s)"; exit 3'
echo "exit code: $?"
corral workspaces exec --argv "$WS" -- ls -a /workspace
corral workspaces stop "$WS" && corral workspaces resume "$WS"
corral workspaces rm "$WS"

# An agent type that may run bash and read files, but not write them; a session of it; its tools.
TYPE=$(corral agent-types create reviewer --tools bash,read --setup 'echo "# notes" > NOTES.md')
S=$(corral sessions start "$TYPE" --wait)
corral sessions tool "$S" bash 'cd /tmp && export GREETING=hi'
corral sessions tool "$S" bash 'echo "$GREETING from $(pwd)"'
corral sessions tool "$S" read NOTES.md
corral sessions tool "$S" write -a path=x.txt -a content=x
corral sessions audit "$S"
corral sessions end "$S"
