"""Ray backend (``trainer.backend=ray``, docs/scaling.md): data-parallel learner ranks over one torch.distributed
process group with torch DDP (:mod:`.data_parallel`), rollout workers and env-server replicas as Ray actors
(:mod:`.actors`), and the training loop that drives them (:mod:`.trainer`). Ray is imported only by the trainer and
the tests, so this package imports without it."""

from agent_rl.distributed.data_parallel import DataParallel, shard_batch

__all__ = ["DataParallel", "shard_batch"]
