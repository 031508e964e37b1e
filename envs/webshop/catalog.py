"""The WebShop catalog: products, sampled prices and goals, built exactly as the reference implementation does.

Reference: ``web_agent_site/engine/engine.py`` (``load_products``, ``generate_product_prices``) and
``web_agent_site/engine/goal.py`` (``get_synthetic_goals``, ``get_human_goals``) of princeton-nlp/WebShop
(Yao et al., NeurIPS 2022), as described in ``docs/webshop.md`` sections 1.3-1.4.

The reference draws prices and goal price limits from the *global* ``random`` module; the fixtures were recorded
with ``random.seed(0)`` before the environment was built and ``random.seed(233); random.shuffle(goals)`` after.
Here a private ``random.Random(seed)`` replays the same draws in the same order, so nothing touches the global RNG.

One :class:`Catalog` per (data directory, goal kind, seed) is built per process and shared by every env instance
through :func:`get_catalog` (a module-level cache); an env/session holds only its page state.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from envs.data import dataset_dir
from envs.errors import EnvDataError

PRODUCTS_FILE = "items_shuffle_1000.reconstructed.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
HUMAN_FILE = "items_human_ins.1k_subset.json"
NOUNS_FILE = "name_nouns_sm38.json"

PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # goal.py PRICE_RANGE: 10, 20, ..., 990
GOAL_SHUFFLE_SEED = 233  # SimServer: random.seed(233); random.shuffle(goals)
NO_PRICE_LIMIT = 1000000  # price_upper when fewer than two price steps lie above the price


@dataclass
class Product:
    """One processed product (the fields of the reference's ``load_products`` that the env uses)."""

    asin: str
    name: str  # raw product name (== Title)
    title: str
    description: str
    bullet_points: list[str]
    category: str
    query: str  # lower-cased, stripped
    product_category: str
    pricing: list[float]  # [price] or [low, high]
    price_tag: str  # "$14.95" or "$10.0 to $20.0"
    options: dict[str, list[str]]  # option name (lower) -> values (lower, '/' -> ' | ')
    attributes: list[str]
    rating: str = "N.A."
    instruction_text: str | None = None
    instruction_attributes: list[str] | None = None
    human_instructions: list[dict[str, Any]] | None = None
    name_nouns: list[str] = field(default_factory=list)  # spaCy nouns of ``name`` (precomputed table)


@dataclass
class Catalog:
    """Products, sampled prices and the shuffled goal list, shared read-only by all sessions.

    Attributes:
        products: processed products in catalog order (this is also the search index's doc-id order).
        by_asin: ASIN -> product.
        prices: ASIN -> the sampled price in dollars (a range is sampled uniformly once per catalog).
        goals: goals in the reference's shuffled order; each a JSON-serialisable dict with keys asin, category,
            query, name, product_category, instruction_text, attributes, price_upper, goal_options, weight.
    """

    products: list[Product]
    by_asin: dict[str, Product]
    prices: dict[str, float]
    goals: list[dict[str, Any]]
    root: Path
    human_goals: bool
    seed: int


def _parse_price(pricing: str | None) -> tuple[list[float], str]:
    """Reference price parsing: ``"$a$b"`` -> ([a, b], "$a to $b"); empty -> ([100.0], "$100.0")."""
    if pricing is None or not pricing:
        return [100.0], "$100.0"
    values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def load_products(root: Path, human_goals: bool = False) -> list[Product]:
    """Load and process the raw catalog like the reference's ``load_products`` (dedup by ASIN, options lowered).

    Args:
        root: the ``webshop`` data directory.
        human_goals: attach the MTurk instructions (human goals) instead of the synthetic instruction fields.
    """
    with open(root / PRODUCTS_FILE, encoding="utf-8") as f:
        raw = json.load(f)
    with open(root / ATTRIBUTES_FILE, encoding="utf-8") as f:
        attributes = json.load(f)
    human: dict[str, Any] = {}
    if human_goals:
        with open(root / HUMAN_FILE, encoding="utf-8") as f:
            human = json.load(f)
    nouns: dict[str, list[str]] = {}
    if (root / NOUNS_FILE).exists():
        with open(root / NOUNS_FILE, encoding="utf-8") as f:
            nouns = json.load(f)["nouns"]

    products: list[Product] = []
    seen: set[str] = set()
    for p in raw:
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, price_tag = _parse_price(p.get("pricing"))
        options: dict[str, list[str]] = {}
        for option_name, contents in (p.get("customization_options") or {}).items():
            if contents is None:
                continue
            options[option_name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
        small = p["small_description"]
        attrs = attributes.get(asin, {})
        product = Product(
            asin=asin,
            name=p["name"],
            title=p["name"],
            description=p["full_description"],
            bullet_points=small if isinstance(small, list) else [small],
            category=p["category"],
            query=p["query"].lower().strip(),
            product_category=p["product_category"],
            pricing=pricing,
            price_tag=price_tag,
            options=options,
            attributes=attrs["attributes"] if "attributes" in attrs else ["DUMMY_ATTR"],
            name_nouns=list(nouns.get(asin, [])),
        )
        if human_goals:
            product.human_instructions = human.get(asin)
        else:
            product.instruction_text = attrs.get("instruction")
            product.instruction_attributes = attrs.get("instruction_attributes")
        products.append(product)
    return products


def sample_prices(products: list[Product], rng: random.Random) -> dict[str, float]:
    """``generate_product_prices``: a fixed price, or ``rng.uniform(low, high)`` for a price range (in order)."""
    prices: dict[str, float] = {}
    for p in products:
        prices[p.asin] = rng.uniform(*p.pricing[:2]) if len(p.pricing) > 1 else p.pricing[0]
    return prices


def _price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    """Goal price limit: the larger of two distinct samples among the first 4 PRICE_RANGE steps above ``price``."""
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) >= 2:
        _, upper = sorted(rng.sample(price_range, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return NO_PRICE_LIMIT, ""


def synthetic_goals(products: list[Product], prices: dict[str, float], rng: random.Random) -> list[dict[str, Any]]:
    """``get_synthetic_goals``: one goal per combination of a product's option values (6910 on the 1k catalog)."""
    goals: list[dict[str, Any]] = []
    count_attrs: dict[str, int] = defaultdict(int)
    for p in products:
        if p.instruction_text is None:
            continue
        attributes = p.instruction_attributes or []
        assert len(attributes) > 0, p.asin
        price_upper, price_text = _price_limit(prices[p.asin], rng)
        names = sorted(p.options)
        for combination in itertools.product(*(p.options[n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": p.asin,
                    "category": p.category,
                    "query": p.query,
                    "name": p.title,
                    "product_category": p.product_category,
                    "instruction_text": f"{p.instruction_text}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": goal_options,
                }
            )
            for a in attributes:
                count_attrs[a] += 1
    for g in goals:
        g["weight"] = sum(1.0 / count_attrs[a] for a in g["attributes"]) / len(g["attributes"])
    return goals


def human_goals_list(products: list[Product], prices: dict[str, float], rng: random.Random) -> list[dict[str, Any]]:
    """``get_human_goals``: one goal per MTurk instruction with non-empty instruction attributes (weight 1)."""
    goals: list[dict[str, Any]] = []
    for p in products:
        for ins in p.human_instructions or []:
            attributes = ins["instruction_attributes"]
            if len(attributes) == 0:
                continue
            price_upper, price_text = _price_limit(prices[p.asin], rng)
            goals.append(
                {
                    "asin": p.asin,
                    "category": p.category,
                    "query": p.query,
                    "name": p.name,
                    "product_category": p.product_category,
                    "instruction_text": ins["instruction"].strip(".") + price_text,
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": ins["instruction_options"],
                    "weight": 1,
                }
            )
    return goals


def build_catalog(root: Path, human_goals: bool = False, seed: int = 0) -> Catalog:
    """Build products, prices and shuffled goals as the reference does after ``random.seed(seed)``.

    Raises:
        EnvDataError: (a ``FileNotFoundError``) the catalog has no product or no goal (an empty or truncated data
            file): the message names the files and the counts found (the published catalog: 1000 products).
    """
    products = load_products(root, human_goals=human_goals)
    rng = random.Random(seed)
    prices = sample_prices(products, rng)
    goals = (human_goals_list if human_goals else synthetic_goals)(products, prices, rng)
    if not products or not goals:
        raise EnvDataError(
            f"the WebShop catalog cannot serve: {len(products)} products in {(root / PRODUCTS_FILE).resolve()}, "
            f"{len(goals)} {'human' if human_goals else 'synthetic'} goals (instructions from "
            f"{(root / (HUMAN_FILE if human_goals else ATTRIBUTES_FILE)).resolve()}); the published catalog has 1000 "
            "products: run `python -m envs.fetch webshop` or set $AGENT_RL_DATA / data.root")
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalog(
        products=products,
        by_asin={p.asin: p for p in products},
        prices=prices,
        goals=goals,
        root=root,
        human_goals=human_goals,
        seed=seed,
    )


_CACHE: dict[tuple[str, bool, int], Catalog] = {}
_LOCK = threading.Lock()


def resolve_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The WebShop data directory: ``data_dir`` if given, else ``envs.data.dataset_dir("webshop")``."""
    if data_dir not in (None, ""):
        path = Path(data_dir).expanduser().resolve()
        if not (path / PRODUCTS_FILE).is_file():
            raise FileNotFoundError(f"{path} holds no {PRODUCTS_FILE}")
        return path
    return dataset_dir("webshop").resolve()


def get_catalog(data_dir: str | os.PathLike | None = None, human_goals: bool = False, seed: int = 0) -> Catalog:
    """The process-wide shared catalog for these settings (built on first use, ~1 s; then a dict lookup)."""
    root = resolve_root(data_dir)
    key = (str(root), bool(human_goals), int(seed))
    catalog = _CACHE.get(key)
    if catalog is None:
        with _LOCK:
            catalog = _CACHE.get(key)
            if catalog is None:
                catalog = build_catalog(root, human_goals=human_goals, seed=seed)
                _CACHE[key] = catalog
    return catalog
