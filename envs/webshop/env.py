"""``agent_rl/WebShop-v0``: the WebShop text shop (Yao et al., NeurIPS 2022) as a gymnasium env.

A faithful offline reproduction of the reference text env (``web_agent_site/envs/web_agent_text_env.py``: its
``WebAgentTextEnv``, ``SimServer`` and ``SimBrowser``) on the 1000-product setting; see ``docs/webshop_env.md``.

Contract:
    - ``reset(seed=None, options=None)``: ``options={"goal_idx": i}`` starts goal ``i`` of the shuffled goal list;
      ``options={"split": "val" | "train" | "all", "index": j}`` starts the split's ``j``-th goal (as ALFWorld's
      ``index``); without ``index`` a goal is drawn uniformly from the split with ``self.np_random``. The split
      defaults to the ``split`` constructor argument. ``val`` = goals 0..499, ``train`` = goals 500.. .
    - ``step(action)``: ``search[keywords]`` (any page) or ``click[value]`` (a clickable of the current page).
      reward = the WebShop score in [0, 1] at Buy Now, else 0.0; ``terminated`` after Buy Now; ``truncated`` is
      always False here (the 15-step limit is gymnasium's ``TimeLimit`` from the registration).
    - ``action_format="tools"`` (docs/tools.md): the two actions as tools (:data:`WEBSHOP_TOOLS`: ``search(query)``,
      ``click(target)``) in ``self.tools`` and reset's ``info["tools"]``; a step takes an ``envs.tools`` call, played
      as ``search[query]`` / ``click[target]``. A reply without a call, an unknown tool or wrong arguments is an
      invalid action whose observation starts ``Invalid tool call: <reason>`` (then the unchanged page).
    - An invalid action leaves the page unchanged (reward 0, not terminated) and sets ``info["invalid_action"]``
      and a readable ``info["error"]``; so does any action after Buy Now (until ``reset``).
    - ``info`` (JSON-serialisable): ``available_actions`` ({has_search_bar, clickables} as the reference),
      ``admissible_actions``, ``instruction``, ``goal_idx``, ``task_id`` (``webshop-goal-<goal_idx>``),
      ``task_type`` (the goal's category: beauty, electronics, fashion, food, furniture),
      ``page`` (search|results|item|sub|done),
      ``results_page``, ``product`` (ASIN on product pages), ``selected_options``, ``won``, ``invalid_action``,
      ``error``; with ``expert=True`` also ``expert_action`` (the oracle's next action) before Buy Now;
      after Buy Now also ``score``, ``reward_details`` (every factor) and ``purchased``.

The catalog and the search index are shared process-wide (``catalog.get_catalog``, ``search.get_index``); an env
instance holds only its goal and page state.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import gymnasium as gym

from envs.errors import EnvInfraError
from envs.spaces import TextSpace, check_action
from envs.tools import ToolCallError, check_action_format, function_tool, invalid_call_text, require_call
from envs.webshop import pages
from envs.webshop.catalog import Catalog, get_catalog
from envs.webshop.oracle import OraclePolicy
from envs.webshop.pages import PageState
from envs.webshop.reward import get_reward
from envs.webshop.search import get_index

OBSERVATION_MODES = ("text", "text_rich", "llm")
SPLITS = ("val", "train", "all")
VAL_GOALS = 500  # verl-agent small setting: val = goals[:500], train = goals[500:]
SEARCH_RETURN_N = 50
WEBSHOP_TOOLS = [
    function_tool("search", "Search the shop for products (only on the search page: click 'back to search' first "
                  "elsewhere).", {"query": {"type": "string", "description": "the search keywords"}}),
    function_tool("click", "Click a button, option or product on the current page, e.g. 'b078gwrc1j', 'buy now', "
                  "'< prev', 'back to search' or an option value.",
                  {"target": {"type": "string", "description": "the clickable's text, one of the page's clickables"}}),
]
"""The tools of ``action_format="tools"``."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_action(action: str) -> tuple[str, str | None]:
    """Reference ``parse_action``: ``name[arg]`` -> (name, arg); no match -> (action, None).

    What the reference's ``re.compile(r"(.+)\\[(.+)\\]").match(action)`` returns (on the first line: ``.`` stops
    at a newline; the name runs to the last ``[`` that has a ``]`` after its argument, the argument to the last
    ``]``), in O(len(action)): that pattern backtracks cubically (``"search[" + "[" * 4000`` took 26 s)."""
    newline = action.find("\n")
    line = action if newline < 0 else action[:newline]
    close = line.rfind("]")
    open_ = line.rfind("[", 1, close - 1) if close >= 2 else -1
    if open_ < 1:
        return action, None
    return line[:open_], line[open_ + 1 : close]


def _same_action(a: str, b: str) -> bool:
    """Whether two action strings are the same command up to case and whitespace (a policy's text passes through a
    tokenizer: the catalog's no-break spaces in ``click[b17-army\xa0green]`` come back as plain spaces)."""
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


class WebShopEnv(gym.Env[str, str]):
    """WebShop text env (see the module docstring for the full contract).

    Args:
        observation_mode: ``text`` | ``text_rich`` (the reference's, byte for byte) | ``llm`` (instruction, page,
            admissible actions; this project's format).
        split: default goal split for ``reset`` without ``goal_idx``: ``train`` | ``val`` | ``all``.
        human_goals: use the 13 human (MTurk) goals instead of the 6910 synthetic ones.
        goal_seed: the seed the reference's global ``random`` had before construction (prices, price limits).
        data_dir: the webshop data directory (default: ``envs.data.dataset_dir("webshop")``).
        max_action_chars: longer actions are rejected as invalid (the reference's Lucene would refuse >1024
            query clauses; 10 kB of text is not a search).
        show_attrs: show the Attributes sub-page button (reference ``show_attrs``; off in all published setups).
        expert: add ``info["expert_action"]``, the scripted oracle's next action (:class:`envs.webshop.oracle.
            OraclePolicy`, which knows the goal: search the instruction, open the target, click the goal options, buy)
            for behaviour cloning and upper-bound rows. The oracle's memory (options tried, fallback search done)
            advances only when its suggestion is the action played, so a step off its path does not corrupt it: it
            plans again from the page it finds. Absent once the episode is over.
        action_format: ``text`` (``search[...]`` / ``click[...]``) or ``tools`` (see the module docstring).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        observation_mode: str = "text",
        split: str = "train",
        human_goals: bool = False,
        goal_seed: int = 0,
        data_dir: str | None = None,
        max_action_chars: int = 2000,
        show_attrs: bool = False,
        expert: bool = False,
        action_format: str = "text",
    ) -> None:
        self.action_format = check_action_format(action_format)
        self.tools = list(WEBSHOP_TOOLS) if action_format == "tools" else []
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.observation_mode = observation_mode
        self.split = split
        self.max_action_chars = int(max_action_chars)
        self.show_attrs = bool(show_attrs)
        self.expert = bool(expert)
        self._oracle: OraclePolicy | None = None
        self._suggestion: tuple[str, OraclePolicy] | None = None  # (expert_action, the oracle after suggesting it)
        self.catalog: Catalog = get_catalog(data_dir, human_goals=human_goals, seed=goal_seed)
        self.index = get_index(self.catalog)
        # Text spaces bound the length only: product text is arbitrary Unicode
        self.observation_space = TextSpace(1_000_000)
        self.action_space = TextSpace(1_000_000)  # longer than max_action_chars: an invalid action, not an error
        self.goal_idx: int | None = None
        self.goal: dict[str, Any] | None = None
        self.session_id = ""
        self.state = PageState()
        self._nodes: list[pages.Node] = []
        self._clickables: dict[str, tuple[str, str]] = {}

    # ------------------------------------------------------------------ public API
    @property
    def num_goals(self) -> int:
        """Number of goals in the shuffled goal list."""
        return len(self.catalog.goals)

    def split_range(self, split: str) -> range:
        """Goal indices of a split: ``val`` 0..499, ``train`` 500.., ``all`` (human goals: every split is all)."""
        n = self.num_goals
        if self.catalog.human_goals or split == "all":
            return range(n)
        if split == "val":
            return range(min(VAL_GOALS, n))
        if split == "train":
            return range(min(VAL_GOALS, n), n)
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on the search page of a goal.

        Raises:
            ValueError: unknown option keys, a bad split, or ``goal_idx`` outside ``[0, num_goals)``.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"goal_idx", "split", "index"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; allowed: goal_idx, split, index")
        if options.get("goal_idx") is not None:
            goal_idx = options["goal_idx"]
            if not _is_int(goal_idx) or not 0 <= goal_idx < self.num_goals:
                raise ValueError(f"goal_idx must be an int in [0, {self.num_goals}), got {goal_idx!r}")
        else:
            split = options.get("split") or self.split
            if split not in SPLITS:
                raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
            rng = self.split_range(split)
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(len(rng)))
            elif not _is_int(index) or not 0 <= index < len(rng):
                raise ValueError(f"index must be an int in [0, {len(rng)}) for split {split!r}, got {index!r}")
            goal_idx = rng[index]
        self.goal_idx = int(goal_idx)
        self.goal = self.catalog.goals[self.goal_idx]
        self.session_id = str(self.goal_idx)  # the reference's session id for reset(session=int)
        self._oracle = OraclePolicy(self.goal) if self.expert else None
        self._suggestion = None
        self._to_search_page()
        self.state.url = f"{pages.BASE_URL}/{self.session_id}"
        if self.action_format == "tools":
            return self._observation(), {**self._info(), "tools": self.tools}
        return self._observation(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply ``search[...]`` / ``click[...]``; see the module docstring for rewards and invalid actions."""
        action = check_action(self, action)  # TypeError for a non-str (HTTP: 422)
        if self.goal is None:
            raise RuntimeError("call reset() before step()")
        if self.action_format == "tools":
            try:
                call = require_call(action, self.tools)
            except ToolCallError as exc:  # not played: the page is unchanged
                self._suggestion = None
                obs, reward, terminated, truncated, info = self._invalid(invalid_call_text(exc))
                return f"{invalid_call_text(exc)}\n\n{obs}", reward, terminated, truncated, {**info,
                                                                                           "tool_error": str(exc)}
            action = f"{call.name}[{call.arguments['query' if call.name == 'search' else 'target']}]"
        if self._suggestion is not None and _same_action(action, self._suggestion[0]):
            self._oracle = self._suggestion[1]  # the expert's step was played: its memory moves on
        self._suggestion = None
        if self.state.kind == "done":
            return self._invalid("the episode is over (Buy Now was clicked); call reset()", terminated=True)
        if len(action) > self.max_action_chars:
            return self._invalid(f"action too long ({len(action)} chars > {self.max_action_chars})")
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        if name == "search" and arg:
            keywords = arg.split(" ")
            if keywords[0] == "<a>":
                return self._invalid("the <a> (attribute) search prefix is disabled: it crashes the reference")
            try:
                self._search(keywords, page=1)
                return self._result(0.0)
            except Exception as exc:  # the search engine or page rendering failed: not a judgement of the action
                raise EnvInfraError(f"WebShop failed on {action!r}: {type(exc).__name__}: {exc}",
                                    component="webshop") from exc
        if name == "click" and arg is not None and arg in self._clickables and arg != "search":
            try:
                return self._click(arg)
            except Exception as exc:  # a page or the reward (Buy Now) could not be computed
                raise EnvInfraError(f"WebShop failed on {action!r}: {type(exc).__name__}: {exc}",
                                    component="webshop") from exc
        return self._invalid(self._explain_invalid(action, name, arg))

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """BM25 search of the catalog: ASINs in rank order (the reference engine's ``search(query, k)``)."""
        return self.index.search(query, k)

    @property
    def available_actions(self) -> dict[str, Any]:
        """The reference's ``get_available_actions()``: ``{"has_search_bar": bool, "clickables": [str, ...]}``."""
        return {"has_search_bar": self.state.kind == "search", "clickables": list(self._clickables)}

    @property
    def admissible_actions(self) -> list[str]:
        """``search[<query>]`` when the search bar shows, then ``click[x]`` for every clickable except 'search'."""
        actions = ["search[<query>]"] if self.state.kind == "search" else []
        return actions + [f"click[{c}]" for c in self._clickables if c != "search"]

    # ------------------------------------------------------------------ pages (SimServer.receive)
    def _to_search_page(self) -> None:
        """The index page: session variables reset (reference ``receive`` without kwargs)."""
        self.state = PageState(kind="search", url=f"{pages.BASE_URL}/{self.session_id}")
        self._render()

    def _top_products(self, keywords: list[str]) -> list[str]:
        """``get_top_n_product_from_keywords`` (``<r>``, ``<c> cat``, ``<q> query`` prefixes, else BM25 top 50)."""
        products = self.catalog.products
        if keywords[0] == "<r>":
            idx = self.np_random.choice(len(products), size=min(SEARCH_RETURN_N, len(products)), replace=False)
            return [products[int(i)].asin for i in idx]
        if keywords[0] == "<c>":
            category = keywords[1].strip() if len(keywords) > 1 else ""
            return [p.asin for p in products if p.category == category]
        if keywords[0] == "<q>":
            query = " ".join(keywords[1:]).strip()
            return [p.asin for p in products if p.query == query]
        return [a for a in self.index.search(" ".join(keywords), k=SEARCH_RETURN_N) if a in self.catalog.by_asin]

    def _search(self, keywords: list[str], page: int) -> None:
        s = self.state
        s.kind, s.keywords, s.page, s.asin, s.options, s.sub_page = "results", keywords, page, None, {}, None
        s.results = self._top_products(keywords)
        s.url = f"{pages.BASE_URL}/search_results/{self.session_id}/{'+'.join(keywords)}/{page}"
        self._render()

    def _item_page(self, clicked: str) -> None:
        s = self.state
        kind, ref = self._clickables[clicked]
        if kind == pages.LINK:
            s.asin = clicked.upper()
            s.asins.add(s.asin)
        elif kind == "radio":
            s.options[ref.lower()] = clicked
        s.kind, s.sub_page = "item", None
        s.url = (
            f"{pages.BASE_URL}/item_page/{self.session_id}/{s.asin}/{'+'.join(s.keywords or [])}/{s.page}/"
            f"{json.dumps(s.options)}"
        )
        self._render()

    def _sub_page(self, clicked: str) -> None:
        s = self.state
        s.kind = "sub"
        s.sub_page = next(k for k in pages.SUB_PAGES if k.lower() == clicked)
        s.url = (
            f"{pages.BASE_URL}/item_sub_page/{self.session_id}/{s.asin}/{'+'.join(s.keywords or [])}/{s.page}/"
            f"{s.sub_page}/{s.options}"
        )
        self._render()

    def _buy(self) -> float:
        s = self.state
        product = self.catalog.by_asin[s.asin]
        goal_nouns = self.catalog.by_asin[self.goal["asin"]].name_nouns
        reward, details = get_reward(product, self.goal, self.catalog.prices[s.asin], s.options, goal_nouns)
        s.kind, s.reward, s.reward_details = "done", reward, details
        s.url = f"{pages.BASE_URL}/done/{self.session_id}/{s.asin}/{s.options}"
        self._render()
        return reward

    def _click(self, clicked: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``SimServer.receive`` for a click, branch for branch (including its URL-based page detection)."""
        where = pages.page_name(self.state.url)
        if clicked == pages.END_BUTTON.lower():
            reward = self._buy()
            return self._result(float(reward), terminated=True)
        if clicked == pages.BACK_TO_SEARCH.lower():
            self._to_search_page()
        elif clicked == pages.NEXT_PAGE.lower() and where == "search_results":
            self._search(self.state.keywords or [""], page=(self.state.page or 1) + 1)
        elif clicked == pages.PREV_PAGE.lower() and where == "search_results":
            self._search(self.state.keywords or [""], page=(self.state.page or 1) - 1)
        elif clicked == pages.PREV_PAGE.lower() and where == "item_sub_page":
            self._item_page(clicked)
        elif clicked == pages.PREV_PAGE.lower() and where == "item_page":
            self._search(self.state.keywords or [""], page=self.state.page or 1)
        elif clicked in (k.lower() for k in pages.SUB_PAGES):
            self._sub_page(clicked)
        else:
            self._item_page(clicked)
        return self._result(0.0)

    # ------------------------------------------------------------------ rendering
    def _render(self) -> None:
        """Build the page's text nodes and its clickables (the reference's ``text_to_clickable``)."""
        s, goal = self.state, self.goal
        instruction = goal["instruction_text"]
        buttons: list[str] = []
        links: list[str] = []
        radios: list[tuple[str, str]] = []
        if s.kind == "search":
            self._nodes = pages.search_nodes(instruction)
            buttons = ["Search"]
        elif s.kind == "results":
            page = s.page or 1
            window = s.results[(page - 1) * pages.PRODUCT_WINDOW : page * pages.PRODUCT_WINDOW]
            items = [(a, self.catalog.by_asin[a].title, self.catalog.by_asin[a].price_tag) for a in window]
            self._nodes = pages.results_nodes(instruction, page, len(s.results), items)
            buttons = [pages.BACK_TO_SEARCH] + ([pages.PREV_PAGE] if page > 1 else []) + [pages.NEXT_PAGE]
            links = window
        elif s.kind == "item":
            p = self.catalog.by_asin[s.asin]
            self._nodes = pages.item_nodes(instruction, p.title, p.price_tag, p.rating, p.options, self.show_attrs)
            subs = list(pages.SUB_PAGES[:3]) + (["Attributes"] if self.show_attrs else [])
            buttons = [pages.BACK_TO_SEARCH, pages.PREV_PAGE] + subs + [pages.END_BUTTON]
            radios = [(name, value) for name, values in p.options.items() for value in values]
        elif s.kind == "sub":
            p = self.catalog.by_asin[s.asin]
            self._nodes = pages.sub_nodes(instruction, s.sub_page, p.description, p.bullet_points, p.attributes)
            buttons = [pages.BACK_TO_SEARCH, pages.PREV_PAGE]
        else:
            self._nodes = pages.done_nodes(s.asin, s.options, s.reward)
        clickables: dict[str, tuple[str, str]] = {}
        for b in buttons:
            clickables[b.lower()] = ("button", b)
        for a in links:
            clickables[a.lower()] = (pages.LINK, a)
        for name, value in radios:
            clickables[value] = ("radio", name)
        self._clickables = clickables

    def _catalog_view(self) -> dict[str, Any]:
        """Product fields the ``llm`` observation shows for the current page."""
        s = self.state
        if s.kind == "results":
            page = s.page or 1
            window = s.results[(page - 1) * pages.PRODUCT_WINDOW : page * pages.PRODUCT_WINDOW]
            return {"items": [(a, self.catalog.by_asin[a].title, self.catalog.by_asin[a].price_tag) for a in window]}
        if s.kind in ("item", "sub") and s.asin:
            p = self.catalog.by_asin[s.asin]
            return {
                "title": p.title,
                "price": p.price_tag,
                "options": p.options,
                "description": p.description,
                "bullet_points": p.bullet_points,
                "attributes": p.attributes,
            }
        return {}

    def _observation(self) -> str:
        if self.observation_mode == "text":
            return pages.render_text(self._nodes)
        if self.observation_mode == "text_rich":
            return pages.render_text_rich(self._nodes, self.state.url, self.state.asins)
        return pages.render_llm(self.goal["instruction_text"], self.state, self._catalog_view(), self.admissible_actions)

    def _info(self, invalid: bool = False, error: str | None = None) -> dict[str, Any]:
        s = self.state
        info: dict[str, Any] = {
            "available_actions": self.available_actions,
            "admissible_actions": self.admissible_actions,
            "instruction": self.goal["instruction_text"],
            "goal_idx": self.goal_idx,
            "task_id": f"webshop-goal-{self.goal_idx}",
            "task_type": str(self.goal.get("category") or "webshop"),
            "page": s.kind,
            "results_page": s.page if s.kind == "results" else None,
            "product": s.asin if s.kind in ("item", "sub", "done") else None,
            "selected_options": dict(s.options),
            "won": bool(s.kind == "done" and s.reward == 1.0),
            "invalid_action": invalid,
            "error": error,
        }
        if self._oracle is not None and s.kind != "done":
            oracle = copy.deepcopy(self._oracle)
            info["expert_action"] = oracle.act(info)
            self._suggestion = (info["expert_action"], oracle)
        if s.kind == "done":
            info["score"] = float(s.reward)
            info["reward_details"] = dict(s.reward_details or {})
            info["purchased"] = {"asin": s.asin, "options": dict(s.options), "price": self.catalog.prices[s.asin]}
        return info

    def _result(self, reward: float, terminated: bool = False) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._observation(), reward, terminated, False, self._info()

    def _invalid(self, error: str, terminated: bool = False) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._observation(), 0.0, terminated, False, self._info(invalid=True, error=error)

    def _explain_invalid(self, action: str, name: str, arg: str | None) -> str:
        if arg is None:
            if action.strip() in ("search[]", "click[]") or action.endswith("[]"):
                return "empty argument: use search[<keywords>] or click[<button>]"
            return f"could not parse {action[:80]!r}: expected search[<keywords>] or click[<button>]"
        if name == "click":
            shown = ", ".join(c for c in list(self._clickables)[:12] if c != "search")
            return f"{arg[:80]!r} is not clickable on this page; clickables: [{shown}]" if shown else (
                f"{arg[:80]!r} is not clickable: nothing on this page is clickable; use search[<keywords>]"
            )
        if name == "search":
            return "empty search: use search[<keywords>]"
        return f"unknown action {name[:40]!r}: use search[<keywords>] or click[<button>] (lower-case names)"
