"""Tokens and hosts, the standard-library half of ``servers.access`` (``servers.serve`` checks its flags with it
before importing the app, so a bad token or bind exits at once): token files, the credential a request carries,
which client it authenticates, and loopback names."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import secrets
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_CLIENT", "LOCAL_CLIENT", "check_tokens", "client_of", "is_loopback_bind", "is_loopback_host",
           "read_token_file"]

#: The client of a server without tokens (every caller is the same client).
LOCAL_CLIENT = "local"
#: The name of the client of a single ``--token``.
DEFAULT_CLIENT = "default"


# ------------------------------------------------------------------------------------------------ tokens
def check_tokens(tokens: Mapping[str, str]) -> list[str]:
    """What is wrong with ``{client name: token}`` (``[]`` when nothing): an empty or whitespace token, a token
    with whitespace or control characters, a name that is empty or holds whitespace, or one token for two names
    (the server could not tell those clients apart)."""
    bad, seen = [], {}
    for name, token in tokens.items():
        if not isinstance(name, str) or not name or any(c.isspace() for c in name) or ":" in name:
            bad.append(f"client name {name!r} (non-empty, no whitespace or ':')")
        if not isinstance(token, str) or not token.strip():
            bad.append(f"the token of {name!r} is empty")
        elif any(c.isspace() or not c.isprintable() for c in token):
            bad.append(f"the token of {name!r} holds whitespace or control characters")
        elif token in seen:
            bad.append(f"clients {seen[token]!r} and {name!r} have the same token")
        else:
            seen[token] = name
    return bad


def read_token_file(path: str | Path) -> dict[str, str]:
    """``{name: token}`` from a file of one ``name: token`` a line (blank lines and ``#`` comments skipped).

    Raises:
        ValueError: the file cannot be read, has no entry, a line without ``:``, a repeated name, or a token
            :func:`check_tokens` refuses (an empty one included); the message names the line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--token-file {path}: cannot read it: {exc}") from None
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, token = line.partition(":")
        name, token = name.strip(), token.strip()
        if not sep:
            raise ValueError(f"--token-file {path}, line {number}: not 'name: token'")
        if name in tokens:
            raise ValueError(f"--token-file {path}, line {number}: client {name!r} appears twice")
        tokens[name] = token
        bad = check_tokens({name: token})
        if bad:
            raise ValueError(f"--token-file {path}, line {number}: {'; '.join(bad)}")
    if not tokens:
        raise ValueError(f"--token-file {path}: no 'name: token' line")
    bad = check_tokens(tokens)
    if bad:
        raise ValueError(f"--token-file {path}: {'; '.join(bad)}")
    return tokens


def _credential(authorization: str | None) -> str | None:
    """The token an ``Authorization`` value carries (Bearer, or Basic's password); ``None`` for none or an empty
    one."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
    elif scheme.lower() != "bearer":
        return None
    return value or None


def client_of(authorization: str | None, tokens: Mapping[str, str] | None) -> str | None:
    """The client an ``Authorization`` header value authenticates, or ``None``. Without tokens every caller is
    :data:`LOCAL_CLIENT`. Every token is compared, in constant time (``secrets.compare_digest``)."""
    if not tokens:
        return LOCAL_CLIENT
    given = _credential(authorization)
    if given is None:
        return None
    found = None
    raw = given.encode("utf-8", "surrogatepass")
    for name, token in tokens.items():
        if secrets.compare_digest(raw, token.encode("utf-8", "surrogatepass")):
            found = name
    return found


# ------------------------------------------------------------------------------------------------ hosts
def _host_name(host: str) -> str:
    """``Host`` header value without its port (``[::1]:8000`` -> ``::1``)."""
    host = host.strip()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback_bind(host: str) -> bool:
    """Whether a bind address is loopback only (``127.0.0.1``, any ``127/8``, ``::1``, ``localhost``)."""
    name = _host_name(host) if host.startswith("[") else host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str | None) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, ``127.x.x.x``, ``[::1]``, any
    port)."""
    return bool(host) and is_loopback_bind(_host_name(host))  # type: ignore[arg-type]
