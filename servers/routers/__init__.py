"""Routes of the env server: ``sessions`` (create/step/reset/close/list) and ``meta`` (health, envs)."""
