"""A scripted oracle for WebShop: it knows the goal, searches its instruction, opens the target, picks the goal
options and buys. Used by tests and by ``scripts/eval_webshop_oracle.py`` to measure the environment.

It acts only on the goal and the step ``info`` (``page``, ``available_actions``, ``product``, ``selected_options``),
so the same policy drives an in-process env and a remote one over HTTP.

Policy (what the reference fixtures' oracle does, plus one fallback):
    1. search page: ``search[<instruction without the price clause>]``;
    2. results: click the target ASIN if listed, else ``next >`` up to page 5 (the 50 results); if the target is not
       among them, search the target's product name once; if still absent, open the first result (a failure
       recorded with its reason);
    3. product page of the target: click each goal option value not yet selected, then ``buy now``;
    4. any other page: go back (``< prev`` / ``back to search``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_PRICE_CLAUSE = re.compile(r", and price lower than [0-9.]+ dollars$")
MAX_RESULT_PAGES = 5


def goal_query(goal: dict[str, Any]) -> str:
    """The goal's instruction without its ", and price lower than X dollars" clause."""
    return _PRICE_CLAUSE.sub("", goal["instruction_text"])


def goal_option_values(goal: dict[str, Any]) -> list[str]:
    """Option values to click: the synthetic goal's dict values, or the human goal's option strings (lower-case)."""
    options = goal["goal_options"]
    values = list(options.values()) if isinstance(options, dict) else list(options)
    return [v.lower() for v in values]


@dataclass
class OraclePolicy:
    """Stateful oracle for one episode of ``goal`` (a goal dict of the catalog)."""

    goal: dict[str, Any]
    fallback_searched: bool = False
    failure: str | None = None
    tried_options: set[str] = field(default_factory=set)

    def act(self, info: dict[str, Any]) -> str:
        """Next action from the step ``info`` of ``WebShopEnv``."""
        page = info["page"]
        clickables: list[str] = info["available_actions"]["clickables"]
        target = self.goal["asin"].lower()
        if page == "search":
            if self.fallback_searched:
                return f"search[{self.goal['name']}]"
            return f"search[{goal_query(self.goal)}]"
        if page == "results":
            if target in clickables:
                return f"click[{target}]"
            products = [c for c in clickables if c not in ("back to search", "next >", "< prev")]
            page_no = info.get("results_page") or 1
            if products and page_no < MAX_RESULT_PAGES:
                return "click[next >]"
            if not self.fallback_searched:
                self.fallback_searched = True
                return f"search[{self.goal['name']}]"
            self.failure = self.failure or "target not in the top 50 for the instruction nor for the product name"
            if products:
                return f"click[{products[0]}]"
            return "click[back to search]"
        if page == "item":
            if (info.get("product") or "").lower() != target and self.failure is None:
                return "click[< prev]"
            selected = set((info.get("selected_options") or {}).values())
            for value in goal_option_values(self.goal):
                if value in selected or value in self.tried_options:
                    continue
                self.tried_options.add(value)
                if value in clickables:
                    return f"click[{value}]"
                self.failure = self.failure or f"goal option {value!r} is not clickable on the product page"
            return "click[buy now]"
        if page == "sub":
            return "click[< prev]"
        return "click[back to search]"


def run_oracle(env: Any, goal_idx: int, max_steps: int = 15) -> dict[str, Any]:
    """Run the oracle on ``goal_idx`` of an in-process ``WebShopEnv`` (or a wrapper of it).

    Returns:
        {goal_idx, score, won, steps, actions, failure}; ``failure`` explains a score below 1 when known.
    """
    _, info = env.reset(options={"goal_idx": goal_idx})
    goal = env.unwrapped.catalog.goals[goal_idx]
    policy = OraclePolicy(goal)
    actions: list[str] = []
    reward, done = 0.0, False
    for _ in range(max_steps):
        action = policy.act(info)
        actions.append(action)
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            done = terminated
            break
    failure = policy.failure
    if not done:
        failure = failure or f"no purchase within {max_steps} steps"
    elif reward < 1.0 and failure is None:
        failure = describe_shortfall(info.get("reward_details") or {}, goal, info.get("selected_options") or {})
    return {
        "goal_idx": goal_idx,
        "score": float(reward) if done else 0.0,
        "won": bool(done and reward == 1.0),
        "steps": len(actions),
        "actions": actions,
        "failure": failure,
    }


def describe_shortfall(
    details: dict[str, Any], goal: dict[str, Any] | None = None, bought_options: dict[str, str] | None = None
) -> str:
    """Which reward factors fell short, from ``info["reward_details"]`` (and which goal options, given the goal)."""
    from envs.webshop.reward import normalize_color, option_matches

    parts = []
    if details.get("r_type", 1.0) < 1.0:
        parts.append(f"type factor {details['r_type']}")
    if details.get("r_att", 1.0) < 1.0:
        parts.append(f"attributes matched {details['r_att']:.2f} (not in the product's attributes or text)")
    if details.get("r_option", 1.0) < 1.0:
        missed = ""
        if goal is not None and isinstance(goal["goal_options"], dict):
            values = list((bought_options or {}).values())
            unmatched = [(k, v) for k, v in goal["goal_options"].items() if option_matches(values, [(k, v)])[1] == 0]
            missed = "; unmatched: " + ", ".join(
                f"{k}: {v!r} (clicked value normalised to {normalize_color(v)!r}, goal tuple kept as is)"
                if normalize_color(v) != v else f"{k}: {v!r}"
                for k, v in unmatched
            )
        parts.append(f"options matched {details['r_option']:.2f}{missed}")
    if details.get("r_price", True) is False:
        parts.append("price above the goal's limit")
    return "; ".join(parts) or "score below 1"
