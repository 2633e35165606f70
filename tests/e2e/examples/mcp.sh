TYPE=$(corral agent-types create mcp-demo --tools bash,read)
python mcp_client.py "$TYPE"
