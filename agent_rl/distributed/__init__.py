"""Ray backend (``trainer.backend=ray``, docs/scaling.md): data-parallel learner ranks over one torch.distributed
process group with torch DDP (:mod:`.data_parallel`), rollout workers and env-server replicas as Ray actors
(:mod:`.actors`), and the backend of the one training loop that drives them (:mod:`.backend`: ``RayBackend``). Ray
is imported only by :mod:`.backend` and the tests, so this package imports without it."""

from agent_rl.distributed.data_parallel import DataParallel, shard_batch

__all__ = ["DataParallel", "shard_batch"]
