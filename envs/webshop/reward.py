"""The WebShop purchase score in [0, 1], exactly as the reference's ``engine/goal.py::get_reward``.

    R = r_type * (n_att + n_opt + r_price) / (|goal.attributes| + |goal.goal_options| + 1)

(Yao et al. 2022, section 3; ``docs/webshop.md`` section 1.4.) Pure functions: products and goals in, numbers out.
The type factor's spaCy noun parse is replaced by the precomputed noun table (``Product.name_nouns``).
"""

from __future__ import annotations

from typing import Any, Iterable

from thefuzz import fuzz

from envs.webshop.catalog import Product

# web_agent_site/engine/normalize.py COLOR_SET (order matters: the first contained colour wins)
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel "
    "camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry cream "
    "crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey heather "
    "indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha "
    "multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow red rose royal "
    "rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise "
    "violet walnut wheat white wine yellow"
).split()
FUZZ_THRESHOLD = 85  # token_set_ratio must exceed this


def normalize_color(value: Any) -> Any:
    """First COLOR_SET entry contained in ``value`` (substring for a str, element for a tuple), else ``value``."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def type_reward(purchased: Product, goal: dict[str, Any], goal_nouns: list[str]) -> dict[str, Any]:
    """``get_type_reward``: r_type in {0, 0.1, 0.5, 1} from query, category and product-name noun overlap."""
    query_match = purchased.query == goal["query"]
    p_cat = {x.strip() for x in purchased.product_category.split("›")}
    g_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(p_cat & g_cat) >= 2
    if len(goal_nouns) == 0:
        title_score = 0.2
    else:
        title_score = len(set(purchased.name_nouns) & set(goal_nouns)) / len(goal_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(purchased: Product, goal_attributes: list[str]) -> int:
    """``get_attribute_reward``: goal attributes fuzzy-matched to a product attribute or found in its text."""
    title = purchased.title.lower()
    bullets = " ".join(purchased.bullet_points).lower()
    description = purchased.description.lower()
    n = 0
    for g_attr in goal_attributes:
        if any(fuzz.token_set_ratio(p_attr, g_attr) > FUZZ_THRESHOLD for p_attr in purchased.attributes):
            n += 1
        elif g_attr in title or g_attr in bullets or g_attr in description:
            n += 1
    return n


def option_matches(purchased_options: Iterable[Any], goal_options: Iterable[Any]) -> tuple[float | None, int]:
    """``get_option_reward``: goal options (synthetic: ``(name, value)`` tuples) fuzzy-matched by a bought option.

    Returns:
        (r_option, n_matches); r_option is None when the goal has no options.
    """
    purchased = [normalize_color(o) for o in purchased_options]
    goal = [normalize_color(o) for o in goal_options]
    n = 0
    for g in goal:
        if any(fuzz.token_set_ratio(p, g) > FUZZ_THRESHOLD for p in purchased):
            n += 1
    return (n / len(goal) if len(goal) > 0 else None), n


def get_reward(
    purchased: Product, goal: dict[str, Any], price: float, options: dict[str, str], goal_nouns: list[str]
) -> tuple[float, dict[str, Any]]:
    """The WebShop score of buying ``purchased`` at ``price`` with the clicked ``options`` for ``goal``.

    Args:
        purchased: the bought product.
        goal: the goal dict (``attributes``, ``goal_options`` dict or list, ``price_upper``, ``query``, ...).
        price: the product's sampled price in dollars.
        options: option name -> clicked value (only options the agent clicked).
        goal_nouns: the noun list of the goal product's name (``Product.name_nouns`` of ``goal["asin"]``).

    Returns:
        (reward in [0, 1], details) with details the reference's verbose info: r_type, r_att, w_att, query_match,
        category_match, title_score, and r_option/w_option (goals with options), r_price/w_price.
    """
    r_type = type_reward(purchased, goal, goal_nouns)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    n_att = attribute_matches(purchased, goal["attributes"])
    goal_options = goal["goal_options"]
    r_option, n_opt = option_matches(
        list(options.values()), goal_options.items() if isinstance(goal_options, dict) else goal_options
    )
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    reward = (n_att + n_opt + r_price) / denominator * r_type["r_type"]
    details: dict[str, Any] = {
        "r_type": r_type["r_type"],
        "r_att": n_att / len(goal["attributes"]),
        "w_att": len(goal["attributes"]) / denominator,
        "query_match": r_type["query_match"],
        "category_match": r_type["category_match"],
        "title_score": r_type["title_score"],
    }
    if r_option is not None:
        details["r_option"] = r_option
        details["w_option"] = len(goal_options) / denominator
    if r_price is not None:
        details["r_price"] = r_price
        details["w_price"] = 1 / denominator
    return reward, details
