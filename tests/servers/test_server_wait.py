"""``python -m servers.wait`` (what compose's ``envs`` target and scripts/check_compose.sh run): returns once every
URL answers /health 200, fails naming the URL still down after its timeout."""

from __future__ import annotations

import time

import pytest

from servers_helpers import free_port, make_app, uvicorn_in_thread

from servers.wait import main, wait_healthy


def test_waits_for_a_server_that_starts_late_and_names_the_one_that_never_does(capsys):
    port, dead = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    with uvicorn_in_thread(make_app(), port, delay_s=1.5):
        t0 = time.monotonic()
        ready = wait_healthy([url], timeout_s=60, interval_s=0.1)
        assert list(ready) == [url] and ready[url] >= 1.0 and time.monotonic() - t0 >= 1.0
        assert main([url, "--timeout", "30"]) == 0
        assert "env servers healthy" in capsys.readouterr().out
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{dead}: URLError"):
            wait_healthy([url, f"http://127.0.0.1:{dead}"], timeout_s=0.5, interval_s=0.1)
        assert main([f"http://127.0.0.1:{dead}", "--timeout", "0.3", "--interval", "0.1"]) == 1
        assert f"not healthy after 0 s: http://127.0.0.1:{dead}" in capsys.readouterr().err


def test_a_watched_server_process_that_exits_stops_the_wait_with_its_code():
    import subprocess
    import sys

    from servers.wait import ServerExited

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    proc.wait()
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerExited, match=f"exited with code 3 before {url} answered /health 200") as info:
        wait_healthy([url], timeout_s=600, interval_s=0.1, process=proc)  # ServerExited, not the TimeoutError
    assert info.value.returncode == 3
