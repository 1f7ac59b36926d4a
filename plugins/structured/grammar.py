"""ConstraintSpec -> llguidance grammar text. JSON is compact by construction: one space after `:`
and `,`, nowhere else, so a model cannot spend its budget on whitespace; JSON strings never admit
raw control characters (llguidance follows RFC 8259 there)."""
from __future__ import annotations

import json
from collections.abc import Callable

from modelcall.core.constraints import ConstraintSpec
from modelcall.core.errors import InvalidRequest

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_schema_grammar(schema: dict) -> str:
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except Exception as e:  # noqa: BLE001 - the library raises plain exceptions for bad schemas
        raise InvalidRequest(f"the JSON schema cannot be enforced: {e}", field="response_format") from None


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: object) -> object:
    """`schema` with `additionalProperties: false` wherever an object schema leaves it open, as
    OpenAI's strict mode reads a schema: a tool's arguments (or a strict response) hold only the
    declared properties. NOTE: without this a free-running model can invent keys forever."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for k in _SUBSCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: closed(sub) for name, sub in out[k].items()}
    for k in _SUBSCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [closed(sub) for sub in out[k]]
    for k in ("items", "additionalProperties", "not"):
        if isinstance(out.get(k), dict):
            out[k] = closed(out[k])
    return out


_DATA_KEYWORDS = ("const", "enum", "default", "examples")  # values there are data, never schemas


def rebased(schema: object, base: str) -> object:
    """`schema` moved under the JSON pointer `base`: its local `$ref`s ("#/$defs/X", "#") point where
    they now are. NOTE: pydantic writes nested models as `$defs` + `$ref` relative to the parameters'
    root, and refs resolve against the whole document, so the combined call schema must rebase them."""
    if isinstance(schema, list):
        return [rebased(x, base) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and v.startswith("#"):
            out[k] = "#" + base + v[1:]
        else:
            out[k] = v if k in _DATA_KEYWORDS else rebased(v, base)
    return out


def call_schema(spec: ConstraintSpec) -> dict:
    """One call as a JSON object: `{name_key: <one of the tools>, args_key: <its arguments>}`."""
    fmt = spec.call_format
    assert fmt is not None
    key = fmt.args_key.replace("~", "~0").replace("/", "~1")
    many = len(spec.tools) > 1
    variants = [{"type": "object", "required": [fmt.name_key, fmt.args_key], "additionalProperties": False,
                 "properties": {fmt.name_key: {"const": name},
                                fmt.args_key: rebased(closed(params), f"{f'/anyOf/{i}' if many else ''}/properties/{key}")}}
                for i, (name, params) in enumerate(spec.tools)]
    schema = {"anyOf": variants} if many else variants[0]
    return {**schema, "x-guidance": JSON_OPTIONS}


def tool_calls_grammar(spec: ConstraintSpec, literal: Callable[[str], str]) -> str:
    """A Lark grammar: prefix, calls in the model's wrapper, suffix. `literal(text)` writes a fixed
    piece of text as Lark (a special token where the tokenizer has one, else a string)."""
    fmt = spec.call_format
    assert fmt is not None
    if spec.min_calls != 1:
        raise InvalidRequest("only one-or-more tool calls can be enforced", field="tool_choice")
    call = " ".join(x for x in (literal(fmt.call_open), "call", literal(fmt.call_close)) if x)
    more = f"({literal(fmt.separator)} {call})*" if spec.max_calls is None else ""
    start = " ".join(x for x in (literal(fmt.prefix), call, more, literal(fmt.suffix)) if x)
    return f"start: {start}\ncall: %json {json.dumps(call_schema(spec))}\n"


def grammar_for(spec: ConstraintSpec, literal: Callable[[str], str]) -> str:
    import llguidance

    if spec.kind == "json":
        schema = spec.schema or {}
        return json_schema_grammar(closed(schema) if spec.strict else schema)
    if spec.kind == "tool_calls":
        for name, params in spec.tools:
            _check_schema(params, f"tools[{name}].parameters")
        return llguidance.LLMatcher.grammar_from_lark(tool_calls_grammar(spec, literal))
    raise InvalidRequest(f"unknown constraint kind {spec.kind!r}", field="response_format")


def _check_schema(schema: dict, where: str) -> None:
    try:
        json_schema_grammar(schema)
    except InvalidRequest as e:
        raise InvalidRequest(f"{where}: {e}", field="tools") from None
