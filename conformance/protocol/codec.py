"""JSON forms shared by the test vectors and the JSON-lines protocol.

- config: the fields of :class:`pagedprefix.spec.CacheConfig` by name.
- request ids, tokens: as JSON values (``1`` and ``"1"`` stay different; invalid values such as
  ``true``, ``1.5``, ``null`` or ``-1`` are carried as they are, to exercise typed errors).
- extras: ``{"lora": {"name", "id"}, "cache_salt", "mm_items": [{"identifier", "start",
  "length"}], "prompt_embeds": {"positions", "data": [hex]}}`` (the form of
  ``pagedprefix.spec.extras.extras_to_json``); absent fields take their defaults, and malformed
  values are passed through so that the engine can reject them.
- errors: the class name of the spec's error (``"OutOfBlocks"`` …).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pagedprefix import spec
from pagedprefix.spec.groups import KVCacheGroup

Json = Any

ERROR_CLASSES: tuple[type[spec.PrefixCacheError], ...] = (
    spec.InvalidConfig,
    spec.InvalidRequestId,
    spec.DuplicateRequest,
    spec.UnknownRequest,
    spec.InvalidTokens,
    spec.InvalidExtras,
    spec.OutOfBlocks,
    spec.Deferred,
)
ERROR_KINDS: tuple[str, ...] = tuple(c.__name__ for c in ERROR_CLASSES)
_ERROR_BY_NAME: dict[str, type[spec.PrefixCacheError]] = {c.__name__: c for c in ERROR_CLASSES}


def error_kind(exc: BaseException) -> str | None:
    """The spec error kind of ``exc``; ``None`` when it is not one of the spec's typed errors."""
    for cls in ERROR_CLASSES:
        if isinstance(exc, cls):
            return cls.__name__
    return None


def make_error(kind: str, message: str, fields: Mapping[str, Json] | None = None) -> Exception:
    """An exception of spec error kind ``kind`` carrying ``message`` (for adapters that receive
    errors as data, e.g. over JSON lines). An unknown kind gives a plain ``RuntimeError``."""
    if kind == "OutOfBlocks":
        f = dict(fields or {})
        err = spec.OutOfBlocks(_opt_int(f.get("needed")), _opt_int(f.get("available")), message=message)
        err.never_fits = f.get("never_fits") is True
        return err
    cls = _ERROR_BY_NAME.get(kind)
    if cls is None:
        return RuntimeError(f"{kind}: {message}")
    made: Exception = cls(message)
    return made


def _opt_int(value: Json) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


HYBRID_FIELDS: dict[str, Json] = {"groups": None, "retention": "replay", "group_free_order": "group_major"}
"""The config fields of hybrid KV-cache groups (SEMANTICS.md section 8) and their defaults: left
out of the JSON form while they have them, so every single-group config reads as before."""


def group_to_json(group: KVCacheGroup) -> dict[str, Json]:
    """``{"kind", "block_size"}`` plus ``"window"`` (sliding) or ``"chunk"`` (chunked)."""
    out: dict[str, Json] = {"kind": group.kind, "block_size": group.block_size}
    if group.kind == "sliding":
        out["window"] = group.window
    if group.kind == "chunked":
        out["chunk"] = group.chunk
    return out


def group_from_json(obj: Json) -> Any:
    """A :class:`KVCacheGroup` from its JSON form; a malformed object is carried as it is (the
    factory must reject the config)."""
    if not isinstance(obj, dict):
        return obj
    return KVCacheGroup(obj.get("kind"), obj.get("block_size"), obj.get("window", 0), obj.get("chunk", 0))  # type: ignore[arg-type]


def config_to_json(config: spec.CacheConfig) -> dict[str, Json]:
    """Every field of the config, by name; the hybrid fields only when they are not the default."""
    out: dict[str, Json] = {}
    for f in dataclasses.fields(spec.CacheConfig):
        value = getattr(config, f.name)
        if f.name in HYBRID_FIELDS:
            if value == HYBRID_FIELDS[f.name]:
                continue
            if f.name == "groups" and isinstance(value, tuple):
                value = [group_to_json(g) if isinstance(g, KVCacheGroup) else g for g in value]
        out[f.name] = value
    return out


def config_from_json(obj: Mapping[str, Json]) -> spec.CacheConfig:
    """A config from its JSON form (missing fields take their defaults; values are not checked)."""
    names = {f.name for f in dataclasses.fields(spec.CacheConfig)}
    unknown = set(obj) - names
    if unknown:
        raise ValueError(f"unknown config fields: {sorted(unknown)}")
    fields = dict(obj)
    groups = fields.get("groups")
    if isinstance(groups, list):
        fields["groups"] = tuple(group_from_json(g) for g in groups)
    return spec.CacheConfig(**fields)


def extras_to_json(extras: spec.Extras) -> dict[str, Json]:
    """The JSON form of ``extras``, default fields left out (``{}`` for no extras)."""
    out: dict[str, Json] = {}
    if extras.lora is not None:
        out["lora"] = {"name": extras.lora.name, "id": extras.lora.lora_id}
    if extras.cache_salt != "":
        out["cache_salt"] = extras.cache_salt
    if extras.mm_items:
        out["mm_items"] = [
            {"identifier": m.identifier, "start": m.start, "length": m.length} for m in extras.mm_items
        ]
    if extras.prompt_embeds is not None:
        pe = extras.prompt_embeds
        out["prompt_embeds"] = {
            "positions": list(pe.positions),
            "data": [d.hex() if isinstance(d, bytes) else d for d in pe.data],
        }
    return out


def _raw(cls: Any) -> Any:
    """``cls`` untyped: malformed fields are built on purpose, for the engine to reject."""
    return cls


def _tuple_or_raw(value: Json) -> Json:
    return tuple(value) if isinstance(value, list) else value


def extras_from_json(obj: Json) -> Any:
    """An :class:`Extras` from its JSON form. Malformed input yields a malformed ``Extras`` (or the
    raw value when ``obj`` is not an object) so the engine's validation is what gets tested."""
    if obj is None:
        return spec.NO_EXTRAS
    if not isinstance(obj, dict):
        return obj
    lora_obj = obj.get("lora")
    lora: Any = lora_obj
    if isinstance(lora_obj, dict):
        lora = _raw(spec.LoRA)(lora_obj.get("name"), lora_obj.get("id"))
    mm_obj = obj.get("mm_items", [])
    mm: Any = mm_obj
    if isinstance(mm_obj, list):
        mm = tuple(
            _raw(spec.MultiModalItem)(m.get("identifier"), m.get("start"), m.get("length"))
            if isinstance(m, dict)
            else m
            for m in mm_obj
        )
    pe_obj = obj.get("prompt_embeds")
    pe: Any = pe_obj
    if isinstance(pe_obj, dict):
        data = pe_obj.get("data", [])
        if isinstance(data, list):
            data = [_hex_or_raw(d) for d in data]
        pe = spec.PromptEmbeds(_tuple_or_raw(pe_obj.get("positions", [])), _tuple_or_raw(data))
    return spec.Extras(lora=lora, cache_salt=obj.get("cache_salt", ""), mm_items=mm, prompt_embeds=pe)


def _hex_or_raw(value: Json) -> Json:
    if isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            return value
    return value


def extra_kinds_of(extras: Json) -> set[str]:
    """Extra-key kinds a JSON extras object uses (``lora``, ``cache_salt``, ``mm``, ``prompt_embeds``)."""
    if not isinstance(extras, dict):
        return set()
    kinds: set[str] = set()
    if extras.get("lora") is not None:
        kinds.add("lora")
    if extras.get("cache_salt", "") != "":
        kinds.add("cache_salt")
    if extras.get("mm_items"):
        kinds.add("mm")
    if extras.get("prompt_embeds") is not None:
        kinds.add("prompt_embeds")
    return kinds
