"""Issue 10, section 6: a server checks that every env it serves can make and reset before ``/health`` is up, and
refuses to start (exit status 3, one last line naming the env, the resolved data path and the counts) when one
cannot: an ALFWorld data root and cache that are empty, an empty ``json_2.1.1/``, a WebShop products file ``[]``."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from servers_helpers import ECHO, free_port, serve_asgi
from test_server_entrypoint import start_server

from servers.app import create_app
from envs.hosting import EnvNotReady

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

NODATA = "user/NoData-v0"


def test_lifespan_refuses_an_env_that_cannot_reset():
    async def main():
        app = create_app([ECHO, NODATA], imports=["user_env_module"], prestart_workers=0)
        with pytest.raises(EnvNotReady, match=r"user/NoData-v0 cannot serve.*no items in /nowhere/user-data \(0 found"):
            async with serve_asgi(app):
                pass
        assert "/nowhere/user-data" in app.state.startup_error
        # opting out of the check (a deployment that only ever passes env_kwargs) starts, and /health is green
        app = create_app([ECHO, NODATA], imports=["user_env_module"], prestart_workers=0, check_envs=False)
        async with serve_asgi(app) as c:
            assert (await c.get("/health")).status_code == 200
            r = await c.post("/sessions", json={"env_id": NODATA, "env_kwargs": {"data": "ok"}})
            assert r.status_code == 201
    asyncio.run(main())


def refused(env_id: str, data_root: Path, cache: Path) -> str:
    """Run ``python -m servers.serve --env env_id`` on this data; it must exit 3. Returns its last output line."""
    proc = start_server(["--env", env_id, "--port", str(free_port())],
                        env={"AGENT_RL_DATA": str(data_root), "AGENT_RL_CACHE": str(cache)})
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the server did not refuse to start:\n{out}")
    assert proc.returncode == 3, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"env server did not start: env {env_id} cannot serve, refusing to start: "), out
    return last


def test_webshop_with_an_empty_products_file_refuses_to_start(tmp_path):
    # Issue input: items_shuffle_1000.reconstructed.json holding []. Used to be healthy, then every reset failed
    # with "goal_idx must be an int in [0, 0)".
    shop = tmp_path / "data" / "webshop"
    shop.mkdir(parents=True)
    (shop / "items_shuffle_1000.reconstructed.json").write_text("[]")
    (shop / "items_ins_v2_1000.json").write_text("{}")
    last = refused("agent_rl/WebShop-v0", tmp_path / "data", tmp_path / "cache")
    assert f"0 products in {shop.resolve()}/items_shuffle_1000.reconstructed.json, 0 synthetic goals" in last


def test_alfworld_with_an_empty_data_root_and_cache_refuses_to_start(tmp_path):
    (tmp_path / "data").mkdir()
    last = refused("agent_rl/ALFWorld-v0", tmp_path / "data", tmp_path / "cache")
    assert str(tmp_path / "data" / "alfworld" / "json_2.1.1_tw-pddl.tar.xz") in last


def test_alfworld_with_an_empty_games_folder_refuses_to_start(tmp_path):
    games = tmp_path / "data" / "alfworld" / "json_2.1.1"
    games.mkdir(parents=True)
    last = refused("agent_rl/ALFWorld-v0", tmp_path / "data", tmp_path / "cache")
    counts = "{'train': 0, 'valid_seen': 0, 'valid_unseen': 0, 'valid_train': 0}"
    assert f"no ALFWorld games in split 'train' under {games.resolve()} (games per split: {counts})" in last
