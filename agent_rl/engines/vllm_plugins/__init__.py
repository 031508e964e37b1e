"""Modules loaded by the ``vllm serve`` processes a run starts, not by the trainer: this folder is the servers'
``PYTHONPATH`` (:data:`agent_rl.engines.vllm_server.PLUGIN_DIR`), so each module here is stdlib-only and imported by
its bare name (``agent_rl_vllm_guard``) in whatever Python runs vLLM."""
