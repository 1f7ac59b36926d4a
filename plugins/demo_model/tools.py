"""The demo model's two tools, offline and deterministic: `calculator` and `get_weather`.

    modelcall agent --base-url http://127.0.0.1:8000/v1 \
        --tools modelcall.plugins.demo_model.tools:calculator modelcall.plugins.demo_model.tools:get_weather \
        "What is 37 * 91?"

The trained demo model was taught to call them (plugins/demo_model/corpus.py), and the server can host
them (`register_server_tools` in plugin.py). They are `modelcall.core.tools.Tool`s: the JSON
Schema comes from the type hints, the description from the docstring.
"""
from __future__ import annotations

import ast
import hashlib
import operator
from fractions import Fraction
from typing import Any

from modelcall.core.tools import Tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 200
MAX_EXPONENT = 64   # 9 ** 64 is fine; 9 ** 9 ** 9 would hang the tool


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression: numbers, + - * / // % **, parentheses.
    Anything else (names, calls, attributes) is a ValueError, never evaluated."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise ValueError("exponents must be whole numbers up to 64")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        return Fraction(_BINARY[type(node.op)](left, right))
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def format_number(value: Fraction) -> str:
    """Whole numbers exactly; others as a decimal of at most 6 places, trailing zeros dropped."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "37 * 91"; returns the result."""
    return format_number(evaluate(expression))


CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy")


def weather_of(city: str) -> dict[str, Any]:
    """The made-up but fixed weather of a city: the same city always gets the same report."""
    name = " ".join(city.split())
    digest = hashlib.sha256(name.casefold().encode("utf-8")).digest()
    condition = CONDITIONS[digest[0] % len(CONDITIONS)]
    low, high = (-9, 3) if condition == "snowy" else (5, 34)
    return {"city": name, "temperature_c": low + digest[1] % (high - low + 1), "condition": condition}


def _get_weather(city: str) -> dict[str, Any]:
    """Get the current weather of a city (offline demo data)."""
    return weather_of(city)


calculator = Tool(_calculator, name="calculator")
get_weather = Tool(_get_weather, name="get_weather")
TOOLS = (calculator, get_weather)
