"""A JSON Schema (draft 2020-12) of the settings file, from the sections' annotations, checks and the
comments of ``config/ferret.example.yaml`` (so the example stays the one place keys are documented).

    .venv/bin/python -m services.config.schema > docs/config.schema.json    # a test keeps it current

Editors validate a ``ferret.yaml`` with it (``# yaml-language-server: $schema=…``). It states types,
defaults, choices and bounds; checks that need code (a reachable file, a librdkafka property, a Redis
URL's parts) run only in :func:`services.config.load_settings`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from services.config.sections import SECTIONS, Section, Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "ferret.example.yaml"


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [_type_schema(a) for a in get_args(tp)]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp in (str, Path):
        return {"type": "string"}
    if origin is dict:
        return {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
    if origin is tuple:
        items = [_type_schema(a) for a in get_args(tp)]
        return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    return {"type": ["string", "number"]}  # values with a parser of their own (e.g. an arrival interval)


def _field_schema(field: dataclasses.Field[Any], tp: Any, doc: str) -> dict[str, Any]:
    meta = field.metadata
    if meta.get("parse") is not None:  # parsed from text: any scalar (or a list for a tuple), described in words
        listed = any(get_origin(a) is tuple for a in (*get_args(tp), tp))
        kinds = ["string", "number", *(["array"] if listed else []), *(["null"] if _optional(tp) else [])]
        schema: dict[str, Any] = {"type": kinds}
    else:
        schema = _type_schema(tp)
    check = meta.get("check")
    bounds = getattr(check, "bounds", None)
    if bounds is not None:
        target = schema if "type" in schema and schema["type"] != "null" else _numeric(schema)
        if target is not None:
            target["minimum"] = bounds[0]
            if bounds[1] is not None:
                target["maximum"] = bounds[1]
    choices = getattr(check, "choices", None)
    if choices is not None:
        schema = {"enum": list(choices)}
    description = " ".join(
        part for part in (doc, f"Expected: {meta['expected']}." if meta.get("expected") else "") if part
    )
    if description:
        schema["description"] = description
    if meta.get("secret"):
        schema["writeOnly"] = True
    schema["default"] = _plain(_default(field))
    return schema


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    factory: Any = field.default_factory
    return factory()


def _optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _numeric(schema: dict[str, Any]) -> dict[str, Any] | None:
    return next((s for s in schema.get("anyOf", []) if s.get("type") in ("integer", "number")), None)


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if dataclasses.is_dataclass(value):
        return str(value)
    return value


def example_comments(path: Path = EXAMPLE) -> dict[str, str]:
    """``section.key`` → the comment lines right above that key in the example file, joined."""
    docs: dict[str, str] = {}
    section, pending = "", []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# ").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z_]+):", line)
        if match:
            if not match.group(1):
                section = match.group(2)
                docs[section] = " ".join(pending)
            else:
                docs[f"{section}.{match.group(2)}"] = " ".join(pending)
        pending = [] if stripped else pending
    return docs


def settings_schema() -> dict[str, Any]:
    docs = example_comments()
    properties: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        properties[name] = _section_schema(name, cls, docs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Ferret settings (ferret.yaml)",
        "description": (Settings.__doc__ or "").strip()
        + " Every key can also be set as FERRET_<SECTION>_<KEY>; see config/ferret.example.yaml.",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def _section_schema(name: str, cls: type[Section], docs: dict[str, str]) -> dict[str, Any]:
    hints = get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return {
        "type": ["object", "null"],
        "description": (cls.__doc__ or "").strip().replace("\n", " "),
        "additionalProperties": False,
        "properties": {f.name: _field_schema(f, hints[f.name], docs.get(f"{name}.{f.name}", "")) for f in fields},
    }


def main() -> None:
    print(json.dumps(settings_schema(), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
