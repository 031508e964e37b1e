"""FastAPI env servers: ``servers.app.create_app`` serves any registered gymnasium id; ``python -m servers.serve``
is the command line. Imports ``envs`` only (never ``agent_rl``)."""
