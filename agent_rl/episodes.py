"""Episode store: what the agent did and where the credit went, one JSONL file per step (schema: docs/viewer.md).

Training writes ``RUN_DIR/episodes/step_000001.jsonl`` (one JSON object per line, one line per episode) after each
learner update, keeping ``trainer.save_episodes`` episodes of the step (``none`` | ``all`` | ``N``: N episodes taken
as whole groups, so a group is always shown complete). Each record holds the task, the temperature (T0 = low,
T1 = high), the group, reward and outcome, and per turn the observation, the raw response (text and token ids), the
parsed action, reward and flags, and per action token the engine log-prob, the learner's log-prob, entropy, JS
divergence, the final token advantage and whether the loss mask trained it (after TP/forking masks). Those per-token
numbers are the learner's own tensors (``Learner.last_token_stats``), read at the positions of each turn's response
in its ``RolloutBatch`` row.

Evaluation writes the same records without the learner's quantities::

    from agent_rl.episodes import write_episodes
    write_episodes(out_dir, step, episodes, tokenizer=tok, source="eval/valid_unseen", append=True)

Readers: :func:`load_episodes` (and :func:`list_steps`), ``python -m agent_rl.viewer RUN_DIR``, or any JSONL tool
(``jq -c '{id, reward, won}' RUN_DIR/episodes/step_000001.jsonl``).

Disk use is bounded per step: at most ``N`` episodes, each at most ``max_turns`` turns of ``max_new_tokens`` tokens
(about 100 bytes per token with its numbers and text) plus its texts, each cut to :data:`MAX_TEXT_CHARS` characters.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from agent_rl.types import fork_base_indices

SCHEMA_VERSION = 1
#: Longest observation / prompt / response text kept (characters); longer ones are cut and flagged ``*_cut``.
MAX_TEXT_CHARS = 20_000
#: Per-token float lists of a turn (parallel to ``token_ids``); the learner's are null when no update ran (eval).
TOKEN_FIELDS = ("logprob", "learner_logprob", "entropy", "js", "advantage", "trained")
#: ``Learner.last_token_stats`` key of each learner per-token field.
STAT_KEYS = {"learner_logprob": "old_logprobs", "entropy": "entropy", "js": "js", "advantage": "advantages",
             "trained": "loss_mask"}
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
_ID = re.compile(r"^(\d+)-(\d+)$")


# ------------------------------------------------------------------------------------------------ settings
def parse_save_episodes(value: str | int) -> int | None:
    """``trainer.save_episodes`` -> episodes kept per step: 0 for ``none``, None for ``all``, N for ``N``.

    Raises:
        ValueError: anything else (the message lists the valid values).
    """
    text = str(value).strip().lower()
    if text in ("none", "0", "false", "off"):
        return 0
    if text == "all":
        return None
    if text.isdigit():
        return int(text)
    raise ValueError(f"trainer.save_episodes={value!r} is not valid; valid values: none, all, or a number N of "
                     "episodes per step (kept as whole groups)")


def select_episodes(episodes: Sequence[Any], keep: int | None, *, seed: int = 0, step: int = 0) -> list[int]:
    """Indices (sorted) of the episodes to store: all (``keep=None``), none (0), or whole groups drawn at random
    (``numpy.random.default_rng([seed, step])``) until at least ``keep`` episodes, i.e. ``ceil(keep / G)`` groups of
    G episodes. Groups are runs of episodes sharing ``task.group_id`` (the orchestrator's order)."""
    if keep is None:
        return list(range(len(episodes)))
    if keep <= 0 or not episodes:
        return []
    groups: dict[int, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(int(ep.task.group_id), []).append(i)
    members = list(groups.values())
    rng = np.random.default_rng([int(seed), int(step)])
    order = rng.permutation(len(members))
    chosen: list[int] = []
    for g in order:
        if len(chosen) >= keep:
            break
        chosen.extend(members[int(g)])
    return sorted(chosen)


# ------------------------------------------------------------------------------------------------ records
def _cut(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_TEXT_CHARS:
        return text, False
    return text[:MAX_TEXT_CHARS] + f"\n... [{len(text) - MAX_TEXT_CHARS} characters cut by the episode store]", True


def _floats(values: Any) -> list[float | None]:
    """float32 values as the shortest decimals that read back to the same float32 (``str(np.float32)``); non-finite
    values (never expected) become null so every file stays standard JSON."""
    arr = np.asarray(values, dtype=np.float32).reshape(-1)
    return [float(str(v)) if math.isfinite(float(v)) else None for v in arr]


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token of ``ids`` such that ``"".join(result) == tokenizer.decode(ids)``: one decode per token
    when that already joins up, else incremental decoding (a multi-byte character split over tokens shows in the
    token that completes it)."""
    ids = [int(t) for t in ids]
    if not ids:
        return []
    full = tokenizer.decode(ids, skip_special_tokens=False)
    pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    if "".join(pieces) == full:
        return list(pieces)
    inc: list[str] = []
    prev = ""
    for i in range(1, len(ids) + 1):
        cur = tokenizer.decode(ids[:i], skip_special_tokens=False)
        if cur.endswith("\ufffd") and i < len(ids) or not cur.startswith(prev):
            inc.append("")  # a byte-level piece that is not yet a whole character
            continue
        inc.append(cur[len(prev):])
        prev = cur
    # tokenizers whose prefix decodes are not prefixes of the whole: keep the one-token decodes
    return inc if "".join(inc) == full else list(pieces)


def task_id(ep: Any) -> str:
    """A readable id of the episode's task: the env's ``task_id`` / ``uid`` / ``goal_idx`` / ``game`` info if it
    reports one, else the task options and seed (``split=train,index=5`` / ``seed=12``)."""
    for turn in reversed(ep.turns):
        for key in ("task_id", "uid", "goal_idx", "game", "game_file"):
            if turn.info.get(key) is not None:
                return str(turn.info[key])
    parts = [f"{k}={v}" for k, v in sorted((ep.task.options or {}).items())]
    if ep.task.seed is not None:
        parts.append(f"seed={ep.task.seed}")
    return ",".join(parts) or ep.task.env_id


def _scalar_info(info: dict[str, Any]) -> dict[str, Any]:
    """The scalar entries of an env info dict (strings cut to 200 characters); lists such as admissible actions are
    left out (they would dominate the file)."""
    out: dict[str, Any] = {}
    for k, v in (info or {}).items():
        if isinstance(v, bool) or v is None or isinstance(v, int):
            out[str(k)] = v
        elif isinstance(v, float):
            out[str(k)] = v if math.isfinite(v) else None
        elif isinstance(v, str):
            out[str(k)] = v[:200]
    return out


def _row_positions(batch: Any, episode: int, turn: int, n_turns: int) -> int:
    """Row of (episode, turn) in ``batch``: the turn's own row in per-turn mode, the episode's one row in
    full-trajectory mode (told apart by the number of rows the episode has)."""
    rows = (batch.episode_index == episode).nonzero().flatten().tolist()
    if len(rows) == n_turns:
        for r in rows:
            if int(batch.turn_index[r]) == turn:
                return r
    if len(rows) == 1:
        return rows[0]
    raise ValueError(f"batch rows of episode {episode} ({len(rows)}) match neither per-turn ({n_turns}) nor "
                     "full-trajectory (1) mode")


def _group_slots(episodes: Sequence[Any]) -> tuple[dict[int, int], list[int]]:
    """Each task group's position (0.., in order of first appearance) and each episode's slot within its group."""
    group_pos: dict[int, int] = {}
    slots: list[int] = []
    seen: dict[int, int] = {}
    for ep in episodes:
        gid = int(ep.task.group_id)
        group_pos.setdefault(gid, len(group_pos))
        slots.append(seen.get(gid, 0))
        seen[gid] = slots[-1] + 1
    return group_pos, slots


def _turn_record(t: Any, k: int, e: int, num_turns: int, *, tokenizer: Any, step: int, source: str, batch: Any,
                 stats: dict[str, np.ndarray] | None, input_ids: np.ndarray | None) -> dict[str, Any]:
    """The record of turn ``k`` (``t``) of episode ``e`` (of ``num_turns`` turns) for :func:`episode_records`;
    ``stats``: the learner's per-token stats (:data:`STAT_KEYS` names, (B, L)) and ``input_ids`` (B, L) of
    ``batch``, or None (the learner fields are null).

    Raises:
        ValueError: the batch row does not hold the turn's response ids.
    """
    ids = [int(x) for x in t.response_ids]
    response, response_cut = _cut(tokenizer.decode(ids, skip_special_tokens=False))
    observation, obs_cut = _cut(str(t.observation))
    turn: dict[str, Any] = {
        "index": k, "observation": observation, "response": response, "action": t.action,
        "token_ids": ids, "token_text": token_texts(tokenizer, ids), "prompt_tokens": len(t.prompt_ids),
        "reward": float(t.reward), "invalid": bool(t.invalid), "terminated": bool(t.terminated),
        "truncated": bool(t.truncated), "response_truncated": bool(t.response_truncated),
        "info": _scalar_info(t.info), "logprob": _floats(t.response_logprobs),
        "policy_version": int(t.policy_version),  # the weights' version that sampled it (section 7)
    }
    if source == "train":  # its staleness at the step it trained (trainer.max_staleness)
        turn["staleness"] = (step - 1) - int(t.policy_version)
    if obs_cut or response_cut:
        turn["observation_cut"], turn["response_cut"] = obs_cut, response_cut
    if stats is not None:
        row = _row_positions(batch, e, k, num_turns)
        start, stop = len(t.prompt_ids), len(t.prompt_ids) + len(ids)
        if input_ids[row, start:stop].tolist() != ids:
            raise ValueError(f"batch row {row} does not hold the response of episode {e} turn {k}")
        for name in STAT_KEYS:
            vals = stats[name][row, start:stop]
            turn[name] = [int(v > 0) for v in vals] if name == "trained" else _floats(vals)
    else:
        turn.update({name: None for name in STAT_KEYS})
    return turn


def episode_records(episodes: Sequence[Any], *, step: int, tokenizer: Any, batch: Any = None,
                    token_stats: dict[str, Any] | None = None, indices: Iterable[int] | None = None,
                    source: str = "train", first_index: int = 0) -> list[dict[str, Any]]:
    """JSON-ready records (schema: docs/viewer.md) of ``episodes[i]`` for i in ``indices`` (default all).

    Args:
        episodes: E :class:`~agent_rl.types.Episode` (failed ones are stored with their ``failure`` and no turns).
        step: training step (or the checkpoint step evaluated).
        tokenizer: the policy's tokenizer (decodes prompts, responses and each token).
        batch: the ``RolloutBatch`` built from exactly ``episodes`` (``build_rollout_batch(episodes, ...)``), whose
            ``episode_index`` numbers them; needed with ``token_stats``.
        token_stats: ``Learner.last_token_stats`` of the update on ``batch``: (B, L) tensors aligned with
            ``batch.input_ids`` (``advantages``, ``loss_mask``, ``old_logprobs``, ``entropy``, ``js``); None (eval):
            the learner fields are null.
        source: ``train`` or e.g. ``eval/valid_unseen``.
        first_index: index of the first record in its step file (ids are ``"{step}-{index}"``).

    Raises:
        ValueError: ``token_stats`` without ``batch``, or a batch row whose tokens are not the turn's response ids
            (the batch was not built from these episodes).
    """
    if token_stats is not None and batch is None:
        raise ValueError("token_stats need the batch they are aligned with")
    stats, input_ids = None, None
    if token_stats is not None:
        stats = {name: np.asarray(token_stats[key].detach().cpu().float()) for name, key in STAT_KEYS.items()}
        input_ids = np.asarray(batch.input_ids.cpu())
    group_pos, slots = _group_slots(episodes)
    records = []
    wanted = list(range(len(episodes)) if indices is None else indices)
    record_id = {e: f"{step}-{first_index + n}" for n, e in enumerate(wanted)}
    fork_base = fork_base_indices(episodes)
    for n, e in enumerate(wanted):
        ep = episodes[e]
        turns = []
        for k, t in enumerate(ep.turns):
            turns.append(_turn_record(t, k, e, len(ep.turns), tokenizer=tokenizer, step=step, source=source,
                                      batch=batch, stats=stats, input_ids=input_ids))
        prompt, prompt_cut = _cut(tokenizer.decode(list(ep.turns[0].prompt_ids), skip_special_tokens=False)
                                  if ep.turns else "")
        adv = [a for t in turns for a in (t["advantage"] or [])]
        trained = [m for t in turns for m in (t["trained"] or [])]
        n_tok = sum(len(t["token_ids"]) for t in turns)
        index = first_index + n
        records.append({
            "schema": SCHEMA_VERSION, "id": f"{step}-{index}", "step": int(step), "index": index, "source": source,
            "task_id": task_id(ep), "task_type": ep.task_type,
            "task": {"env_id": ep.task.env_id, "options": ep.task.options, "seed": ep.task.seed,
                     "group_id": int(ep.task.group_id)},
            "group": group_pos[int(ep.task.group_id)], "slot": slots[e],
            "temperature": float(ep.temperature), "is_high": bool(ep.is_high),
            "temp_label": "T1" if ep.is_high else "T0",
            "reward": float(ep.reward), "won": bool(ep.won), "failure": ep.failure, "num_turns": len(ep.turns),
            "num_tokens": n_tok, "prompt": prompt, "prompt_cut": prompt_cut,
            "advantage_mean": (sum(x for x in adv if x is not None) / len(adv)) if stats is not None and adv else None,
            "trained_frac": (sum(trained) / len(trained)) if stats is not None and trained else None,
            "turns": turns,
        })
        if ep.fork is not None:  # a forked sibling (rollout.fork): its base's record and the turn it forked at
            records[-1]["fork"] = {"base": record_id.get(fork_base.get(e, -1)), "base_slot": int(ep.fork.base_slot),
                                   "turn": int(ep.fork.turn)}
    return records



# ------------------------------------------------------------------------------------------------ files
def episodes_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "episodes"


def step_path(run_dir: str | Path, step: int) -> Path:
    """``RUN_DIR/episodes/step_000001.jsonl``."""
    return episodes_dir(run_dir) / f"step_{int(step):06d}.jsonl"


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.endswith(b"\n"))


def write_episodes(run_dir: str | Path, step: int, episodes: Sequence[Any], *, tokenizer: Any, batch: Any = None,
                   token_stats: dict[str, Any] | None = None, indices: Iterable[int] | None = None,
                   source: str = "train", append: bool = False) -> Path:
    """Write the records of ``episodes`` (:func:`episode_records`) to ``RUN_DIR/episodes/step_{step:06d}.jsonl``.

    ``append=False`` (training) replaces the step's file atomically (temp file + rename: a viewer reading a live run
    never sees half a file, and a resumed run that re-plays a step replaces its records). ``append=True``
    (evaluation: several panels into one step) appends lines; ids continue after the lines already there.
    Returns the file's path.
    """
    path = step_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    first = _count_lines(path) if append else 0
    records = episode_records(episodes, step=step, tokenizer=tokenizer, batch=batch, token_stats=token_stats,
                              indices=indices, source=source, first_index=first)
    text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
    if append:
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
    else:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path


def save_step_episodes(run_dir: str | Path, step: int, episodes: Sequence[Any], setting: str | int, *,
                       tokenizer: Any, batch: Any, token_stats: dict[str, Any] | None, seed: int = 0) -> Path | None:
    """The trainer's hook: store the episodes ``trainer.save_episodes`` asks for (none | all | N as whole groups,
    :func:`select_episodes`) with the learner's per-token tensors of this step. Returns the file (None: nothing
    stored)."""
    keep = parse_save_episodes(setting)
    indices = select_episodes(episodes, keep, seed=seed, step=step)
    if not indices:
        return None
    return write_episodes(run_dir, step, episodes, tokenizer=tokenizer, batch=batch, token_stats=token_stats,
                          indices=indices)


def list_steps(run_dir: str | Path) -> list[int]:
    """Steps that have an episode file, ascending."""
    folder = episodes_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def read_step_file(path: str | Path) -> list[dict[str, Any]]:
    """Records of one step file; a last line without its newline (a file being appended to) is skipped, and so is
    a line that is not JSON (with a warning)."""
    records = []
    with Path(path).open("r", encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.endswith("\n"):
                break
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{n + 1}: not a JSON line, skipped", stacklevel=2)
    return records


def load_episodes(run_dir: str | Path, step: int | None = None) -> list[dict[str, Any]]:
    """Stored episode records of a run (or eval output) directory: one step's, or every step's in step order.

    Returns [] when nothing is stored (yet). Raises ``FileNotFoundError`` when ``run_dir`` does not exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {run_dir}")
    steps = list_steps(run_dir) if step is None else [int(step)]
    out: list[dict[str, Any]] = []
    for s in steps:
        path = step_path(run_dir, s)
        if path.is_file():
            out.extend(read_step_file(path))
    return out


def parse_episode_id(episode_id: str) -> tuple[int, int]:
    """``"12-3"`` -> (step 12, index 3); ``ValueError`` for anything else."""
    m = _ID.match(episode_id)
    if not m:
        raise ValueError(f"episode id {episode_id!r} is not '<step>-<index>'")
    return int(m.group(1)), int(m.group(2))
