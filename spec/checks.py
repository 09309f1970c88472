"""Input checks shared by every spec cache: request ids, block ids, token lists and keys are
copied to exact built-in values (so a subclass's overridden methods never run) or refused with the
typed error of SEMANTICS.md section 4."""

from __future__ import annotations

from .errors import InvalidBlockId, InvalidRequestId, InvalidTokens, safe_repr
from .extras import Extras, check_extras

RequestId = str | int
MAX_TOKEN = 2**32

def _plain_int(x: object) -> int | None:
    """``x`` as an exact ``int`` when it is an int (a subclass is copied through ``int``'s own slot,
    so its overridden methods never run); ``None`` for anything else, ``bool`` included."""
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return int.__index__(x)


def check_request_id(request_id: object) -> RequestId:
    """``request_id`` as an exact ``str`` or ``int`` (a subclass's value, copied without calling its
    methods); :class:`InvalidRequestId` unless it is a ``str`` or an ``int`` (not a ``bool``:
    ``True`` is not request 1). Operations key requests by the returned value."""
    if isinstance(request_id, str):
        return str.__str__(request_id)
    as_int = _plain_int(request_id)
    if as_int is not None:
        return as_int
    raise InvalidRequestId(f"request id must be a str or an int, got {type(request_id).__name__}")


def check_block_id(block_id: object, num_blocks: int) -> int:
    """``block_id`` as an exact int; :class:`InvalidBlockId` unless it is an int in
    ``[0, num_blocks)`` (negative ids are not Python-style indexes from the end)."""
    as_int = _plain_int(block_id)
    if as_int is not None and 0 <= as_int < num_blocks:
        return as_int
    raise InvalidBlockId(f"block id {safe_repr(block_id)} is not an int in [0, {num_blocks})")


def check_tokens(tokens: object) -> list[int]:
    """A copy of ``tokens`` as a list of exact ints; :class:`InvalidTokens` unless it is a non-empty
    list or tuple of ints in ``[0, 2**32)`` (``bool`` rejected). A subclass of list, tuple or int is
    read through the base type's own methods, so an override cannot change what is checked."""
    if isinstance(tokens, list):
        items = list(list.__iter__(tokens))
    elif isinstance(tokens, tuple):
        items = list(tuple.__iter__(tokens))
    else:
        raise InvalidTokens(f"tokens must be a list or tuple of ints, got {type(tokens).__name__}")
    if not items:
        raise InvalidTokens("tokens must not be empty")
    out: list[int] = []
    for t in items:
        as_int = _plain_int(t)
        if as_int is None or not 0 <= as_int < MAX_TOKEN:
            raise InvalidTokens(f"token ids must be ints in [0, 2**32), got {safe_repr(t)}")
        out.append(as_int)
    return out


def check_prompt(tokens: object, extras: Extras) -> list[int]:
    """:func:`check_tokens`, then the extras against that many tokens (``check_extras``): the
    precedence tokens before extras of SEMANTICS.md section 4. Returns the checked token list."""
    token_list = check_tokens(tokens)
    check_extras(extras, len(token_list))
    return token_list


def check_key(key: object) -> bytes | None:
    """``key`` as exact ``bytes`` (the type every block key has), or ``None`` when it is not bytes:
    such a value is the key of no block."""
    if not isinstance(key, bytes):
        return None
    return bytes.__getitem__(key, slice(None))


def request_sort_key(request_id: RequestId) -> tuple[bool, RequestId]:
    """Ints before strs, each in natural order (``1`` and ``"1"`` are different ids)."""
    return (isinstance(request_id, str), request_id)
