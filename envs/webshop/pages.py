"""WebShop pages as the text the reference's browser shows, without HTML.

The reference renders Jinja templates (``web_agent_site/templates/*.html``), parses them with BeautifulSoup
(``html.parser``) and keeps the visible text nodes (``web_agent_text_env.py::convert_html_to_text``). Here each page
is built directly as that list of text nodes, each tagged with what the reference's ``text_rich`` mode looks at
(the parent tag: button, option label, product link, or plain text). BeautifulSoup's whitespace rule is kept: a node
of ASCII whitespace only becomes ``"\\n"`` (if it holds a newline) or ``" "``, except inside ``<pre>``; an empty
string makes no node. Template indentation collapses to ``"\\n"`` nodes, which both text modes drop, so it is left out.

Observation modes:

- ``text``: ``" [SEP] ".join(node.strip())`` (reference ``simple=True``);
- ``text_rich``: one line per node, ``[button] x [button_]`` for buttons, ``  [clicked button] x [clicked button_]``
  for selected options (the reference's URL-substring test, quirks included), ``You have clicked x.`` prepended;
- ``llm``: this project's format for language models (see :func:`render_llm`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

BASE_URL = "http://127.0.0.1:3000"  # the reference SimServer's base URL (part of the URL-substring quirks)
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
PRODUCT_WINDOW = 10  # products per results page

_ASCII_SPACES = str.maketrans("", "", "\x20\x0a\x09\x0c\x0d")

# node kinds: what text_rich keys on (BeautifulSoup parent tag)
TEXT, BUTTON, LABEL, LINK = "text", "button", "label", "link"
Node = tuple[str, str]


@dataclass
class PageState:
    """The page state of one session (all a session holds besides its goal).

    ``kind`` is one of ``search``, ``results``, ``item``, ``sub``, ``done``; ``url`` is the URL the reference's
    browser would show (its substrings drive the reference's page detection and ``text_rich`` option marks).
    """

    kind: str = "search"
    url: str = ""
    keywords: list[str] | None = None
    page: int | None = None
    asin: str | None = None
    asins: set[str] = field(default_factory=set)
    options: dict[str, str] = field(default_factory=dict)
    results: list[str] = field(default_factory=list)  # ASINs of the whole result list (<= 50 for BM25)
    sub_page: str | None = None
    reward: float | None = None
    reward_details: dict[str, Any] | None = None


def _node(text: str, kind: str = TEXT, pre: bool = False) -> list[Node]:
    """BeautifulSoup's string handling: drop empty, collapse ASCII-whitespace-only strings (not in ``<pre>``)."""
    if text == "":
        return []
    if not pre and text.translate(_ASCII_SPACES) == "":
        text = "\n" if "\n" in text else " "
    return [(text, kind)]


def tojson(value: Any) -> str:
    """Flask's ``tojson`` filter: sorted keys, ASCII, and ``< > & '`` escaped as ``\\u00XX``."""
    out = json.dumps(value, sort_keys=True, ensure_ascii=True)
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


def page_name(url: str | None) -> str | None:
    """The reference's ``SimServer.get_page_name``: the first page name contained in the URL ('' = search page)."""
    if url is None:
        return None
    for name in ("search_results", "item_page", "item_sub_page", "done"):
        if name in url:
            return name
    return ""


def _instruction(instruction: str) -> list[Node]:
    return _node("Instruction:") + _node(instruction)


def search_nodes(instruction: str) -> list[Node]:
    """``search_page.html``: logo, instruction, Search button."""
    return _node("WebShop") + _node("Instruction: ") + _node(instruction) + _node("Search", BUTTON)


def results_nodes(instruction: str, page: int, total: int, items: list[tuple[str, str, str]]) -> list[Node]:
    """``results_page.html``: items are (ASIN, Title, Price tag) of this page's products."""
    nodes = _instruction(instruction) + _node(BACK_TO_SEARCH, BUTTON) + _node(f"Page {page} (Total results: {total})")
    if page > 1:
        nodes += _node(PREV_PAGE, BUTTON)
    nodes += _node(NEXT_PAGE, BUTTON)
    for asin, title, price in items:
        nodes += _node(asin, LINK) + _node(title) + _node(price)
    return nodes


def item_nodes(
    instruction: str, title: str, price_tag: str, rating: str, options: dict[str, list[str]], show_attrs: bool = False
) -> list[Node]:
    """``item_page.html``: navigation, option names and value labels, title, price, rating, sub-page buttons."""
    nodes = _instruction(instruction) + _node(BACK_TO_SEARCH, BUTTON) + _node(PREV_PAGE, BUTTON)
    for name, values in options.items():
        nodes += _node(name)
        for value in values:
            nodes += _node(value, LABEL)
    nodes += _node(title) + _node(f"Price: {price_tag}") + _node(f"Rating: {rating}")
    for sub in SUB_PAGES[:3] + (("Attributes",) if show_attrs else ()):
        nodes += _node(sub, BUTTON)
    return nodes + _node(END_BUTTON, BUTTON)


def sub_nodes(instruction: str, sub_page: str, description: str, bullet_points: list[str], attributes: list[str]) -> list[Node]:
    """``description_page.html`` / ``features_page.html`` / ``review_page.html`` (reviews are always empty here)."""
    nodes = _instruction(instruction) + _node(BACK_TO_SEARCH, BUTTON) + _node(PREV_PAGE, BUTTON)
    if sub_page == "Description":
        nodes += _node(description)
    elif sub_page == "Features":
        for bullet in bullet_points:
            nodes += _node(f" {bullet}")
    elif sub_page == "Attributes":
        for attribute in attributes:
            nodes += _node(attribute)
    return nodes


def done_nodes(asin: str, options: dict[str, str], reward: float) -> list[Node]:
    """``done_page.html`` as the text env renders it (goal fields not passed, so the Target block is empty)."""
    nodes = _node("Thank you for shopping with us!") + _node("Your code: ") + _node("None", pre=True)
    nodes += _node(" (Paste it in your MTurk interface.)") + _node("Purchased")
    nodes += _node("asin") + _node(asin, pre=True) + _node("options") + _node(tojson(options), pre=True)
    for label in ("attrs", "category", "query", "product category"):
        nodes += _node(label) + _node("None", pre=True)
    nodes += _node("Target")
    for label in ("asin", "options", "attrs", "price upper", "instuction text", "category", "product category", "query"):
        nodes += _node(label)
    nodes += _node("Goal ") + _node("None", pre=True) + _node("Reward")
    nodes += _node("Your score (min 0.0, max 1.0)") + _node(str(reward), pre=True)
    return nodes + _node("Reward Details ") + _node("None", pre=True)


def render_text(nodes: list[Node]) -> str:
    """Reference ``text`` mode: stripped node texts joined by `` [SEP] `` (nodes equal to ``"\\n"`` dropped)."""
    return " [SEP] ".join(t.strip() for t, _ in nodes if t != "\n")


def render_text_rich(nodes: list[Node], url: str, clicked_asins: set[str]) -> str:
    """Reference ``text_rich`` mode (``convert_html_to_text(simple=False)``), byte for byte.

    An option label counts as clicked when ``'"value"'`` occurs in the page URL (which holds the json-dumped chosen
    options), so values with quotes or non-ASCII never show as clicked: a reference quirk kept on purpose.
    """
    observation = ""
    for t, kind in nodes:
        if t == "\n":
            continue
        if kind == BUTTON:
            processed = f"[button] {t} [button_]"
        elif kind == LABEL:
            if f'"{t}"' in url:
                processed = f"  [clicked button] {t} [clicked button_]"
                observation = f"You have clicked {t}.\n" + observation
            else:
                processed = f"  [button] {t} [button_]"
        elif kind == LINK:
            processed = f"\n[clicked button] {t} [clicked button_]" if t in clicked_asins else f"\n[button] {t} [button_]"
        else:
            processed = t
        observation += processed + "\n"
    return observation


def render_llm(
    instruction: str,
    state: PageState,
    catalog_view: dict[str, Any],
    admissible: list[str],
) -> str:
    """This project's observation for language models: instruction, page content, admissible actions.

    Layout (plain text, one block per section)::

        Instruction: <goal instruction>

        Page: <what page this is>
        <page content: results as "[asin] title | price", product fields, selected options ...>

        Admissible actions:
        <one action per line>

    ``catalog_view`` holds the fields of the products on the page (see ``WebShopEnv._catalog_view``).
    """
    lines = [f"Instruction: {instruction}", ""]
    if state.kind == "search":
        lines.append("Page: search page. Search the shop with search[<keywords>].")
    elif state.kind == "results":
        query = " ".join(state.keywords or [])
        total = len(state.results)
        page = state.page or 1
        lines.append(f'Page: search results for "{query}", page {page} ({total} results, {PRODUCT_WINDOW} per page).')
        items = catalog_view.get("items", [])
        if not items:
            lines.append("No products on this page.")
        for asin, title, price in items:
            lines.append(f"[{asin.lower()}] {title} | {price}")
    elif state.kind == "item":
        lines.append(f"Page: product {state.asin.lower() if state.asin else ''}.")
        lines.append(f"Title: {catalog_view['title']}")
        lines.append(f"Price: {catalog_view['price']}")
        for name, values in catalog_view["options"].items():
            chosen = state.options.get(name)
            shown = ", ".join(f"[{v}]" if v == chosen else v for v in values)
            lines.append(f"Option {name}: {shown}")
        if state.options:
            lines.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in state.options.items()))
        else:
            lines.append("Selected: nothing yet (click an option value to select it).")
    elif state.kind == "sub":
        lines.append(f"Page: {state.sub_page} of product {state.asin.lower() if state.asin else ''}.")
        if state.sub_page == "Description":
            lines.append(catalog_view["description"].strip() or "(no description)")
        elif state.sub_page == "Features":
            lines.extend(f"- {b.strip()}" for b in catalog_view["bullet_points"] if b.strip())
        elif state.sub_page == "Reviews":
            lines.append("(no reviews)")
        else:
            lines.extend(f"- {a}" for a in catalog_view.get("attributes", []))
    else:
        chosen = ", ".join(f"{k}: {v}" for k, v in state.options.items()) or "no options"
        lines.append(f"Page: purchase done. You bought {state.asin} ({chosen}). Score: {state.reward}.")
    lines += ["", "Admissible actions:"]
    lines.extend(admissible if admissible else ["(none: the episode is over)"])
    return "\n".join(lines)
