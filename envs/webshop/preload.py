"""Import this module to build the default WebShop catalog and search index now (about 2 s), not at first reset.

For env servers whose worker processes fork from a pre-importing parent (``envs.hosting.pool`` forkserver): serve with
``python -m servers.serve --env agent_rl/WebShop-v0 --import envs.webshop.preload`` and every worker inherits the
built catalog and index instead of building its own.

It also calls ``gc.freeze()``: the catalog's ~60k long-lived objects move to the permanent generation, so a full
``gc.collect()`` (the server's workers run one at every session close) costs microseconds instead of ~100 ms, and
forked workers do not dirty the shared pages by scanning them.
"""

import gc

from envs.webshop.catalog import get_catalog
from envs.webshop.search import get_index

try:
    CATALOG = get_catalog()
    INDEX = get_index(CATALOG)
    gc.collect()
    gc.freeze()
except FileNotFoundError:  # no data here: envs build on first use (and raise a clear error then)
    CATALOG = None
    INDEX = None
