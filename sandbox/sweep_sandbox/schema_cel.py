"""A fast evaluator for the CEL subset CRD rules mostly use (has(), fields, literals, operators, `in`, ternary).

Expressions outside the subset return None from `compile_fast` and go to cel-python; a unit test checks both agree
on every rule the emulator loads. Semantics follow cel-spec (langdef.md): error-absorbing && and ||, no implicit
int/double arithmetic, heterogeneous numeric comparison and equality as cel-go enables them for Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(
    r"""
    \s*(?:
      (?P<double>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?)
    | (?P<int>\d+)
    | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,()\[\]])
    )""",
    re.VERBOSE,
)
_RESERVED = {"true": True, "false": False, "null": None}

Program = Callable[[Mapping[str, Any]], Any]


class CelError(Exception):
    """A runtime error, worded as cel-go words it (`no such key: x`, `no such overload`)."""


class _Unsupported(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    result, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise _Unsupported(text[position:])
        kind = match.lastgroup or ""
        result.append((kind, match.group(kind)))
        position = match.end()
    return result


def _string_literal(token: str) -> str:
    body = token[1:-1]
    if "\\" in body:
        if re.search(r"\\[^\\'\"nt]", body):
            raise _Unsupported(token)  # escapes beyond the simple ones: cel-python decides
        body = body.replace("\\n", "\n").replace("\\t", "\t").replace("\\'", "'").replace('\\"', '"')
        body = body.replace("\\\\", "\\")
    return body


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cel_equal(a: Any, b: Any) -> bool:
    """CEL ==: numbers compare across int/double, a bool is never a number, lists and maps element-wise."""
    if _is_number(a) and _is_number(b):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(cel_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _compare(op: str, a: Any, b: Any) -> bool:
    if not ((_is_number(a) and _is_number(b)) or (type(a) is type(b) and isinstance(a, str | bool))):
        raise CelError("no such overload")
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _arith(op: str, a: Any, b: Any) -> Any:
    if op == "+" and type(a) is type(b) and isinstance(a, str | list):
        return a + b
    if not (_is_number(a) and _is_number(b) and type(a) is type(b)):
        raise CelError("no such overload")
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if isinstance(a, int):
        if b == 0:
            raise CelError("division by zero" if op == "/" else "modulus by zero")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # truncated, as Go
        return quotient if op == "/" else a - b * quotient
    if op == "/":
        return a / b if b else (float("inf") if a > 0 else float("-inf") if a < 0 else float("nan"))
    raise CelError("no such overload")  # % on doubles


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.position = 0

    def peek(self) -> str:
        return self.tokens[self.position][1] if self.position < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.position >= len(self.tokens):
            raise _Unsupported("end of expression")
        token = self.tokens[self.position]
        if expected is not None and token[1] != expected:
            raise _Unsupported(f"expected {expected}, found {token[1]}")
        self.position += 1
        return token

    def expression(self) -> Program:
        condition = self.disjunction()
        if self.peek() != "?":
            return condition
        self.take("?")
        then = self.expression()
        self.take(":")
        otherwise = self.expression()

        def ternary(env: Mapping[str, Any]) -> Any:
            chosen = condition(env)
            if not isinstance(chosen, bool):
                raise CelError("no such overload")
            return then(env) if chosen else otherwise(env)

        return ternary

    def disjunction(self) -> Program:
        left = self.conjunction()
        while self.peek() == "||":
            self.take()
            left = _or(left, self.conjunction())
        return left

    def conjunction(self) -> Program:
        left = self.relation()
        while self.peek() == "&&":
            self.take()
            left = _and(left, self.relation())
        return left

    def relation(self) -> Program:
        left = self.addition()
        while self.peek() in ("==", "!=", "<", "<=", ">", ">=", "in"):
            op = self.take()[1]
            left = _relation(op, left, self.addition())
        return left

    def addition(self) -> Program:
        left = self.multiplication()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            left = _binary(op, left, self.multiplication())
        return left

    def multiplication(self) -> Program:
        left = self.unary()
        while self.peek() in ("*", "/", "%"):
            op = self.take()[1]
            left = _binary(op, left, self.unary())
        return left

    def unary(self) -> Program:
        if self.peek() == "!":
            self.take()
            operand = self.unary()

            def negation(env: Mapping[str, Any]) -> Any:
                value = operand(env)
                if not isinstance(value, bool):
                    raise CelError("no such overload")
                return not value

            return negation
        if self.peek() == "-":
            self.take()
            operand = self.unary()

            def minus(env: Mapping[str, Any]) -> Any:
                value = operand(env)
                if not _is_number(value):
                    raise CelError("no such overload")
                return -value

            return minus
        return self.member()

    def member(self) -> Program:
        value = self.primary()
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "ident" or self.peek() == "(":
                    raise _Unsupported(name)  # a method call: cel-python's
                value = _select(value, name)
            else:
                index = self.expression()
                self.take("]")
                value = _index(value, index)
        return value

    def primary(self) -> Program:
        kind, text = self.take()
        if kind == "int":
            number = int(text)
            return lambda env: number
        if kind == "double":
            real = float(text)
            return lambda env: real
        if kind == "string":
            literal = _string_literal(text)
            return lambda env: literal
        if kind == "ident":
            if text in _RESERVED:
                constant = _RESERVED[text]
                return lambda env: constant
            if text == "has" and self.peek() == "(":
                return self.has()
            if self.peek() == "(":
                raise _Unsupported(text)  # a function: cel-python's
            if text not in ("self", "oldSelf"):
                raise _Unsupported(text)
            name = text

            def variable(env: Mapping[str, Any]) -> Any:
                if name not in env:
                    raise CelError(f"undeclared reference to '{name}'")
                return env[name]

            return variable
        if text == "(":
            inner = self.expression()
            self.take(")")
            return inner
        if text == "[":
            items: list[Program] = []
            while self.peek() != "]":
                items.append(self.expression())
                if self.peek() == ",":
                    self.take()
            self.take("]")
            return lambda env: [item(env) for item in items]
        raise _Unsupported(text)

    def has(self) -> Program:
        self.take("(")
        target = self.primary()
        fields = []
        while self.peek() == ".":
            self.take()
            kind, name = self.take()
            if kind != "ident":
                raise _Unsupported(name)
            fields.append(name)
        self.take(")")
        if not fields:
            raise _Unsupported("has() without a field")
        for name in fields[:-1]:
            target = _select(target, name)
        last = fields[-1]

        def presence(env: Mapping[str, Any]) -> bool:
            value = target(env)
            if not isinstance(value, dict):
                raise CelError("no such overload")
            return last in value

        return presence


def _select(target: Program, name: str) -> Program:
    def select(env: Mapping[str, Any]) -> Any:
        value = target(env)
        if not isinstance(value, dict):
            raise CelError("no such overload")
        if name not in value:
            raise CelError(f"no such key: {name}")
        return value[name]

    return select


def _index(target: Program, index: Program) -> Program:
    def lookup(env: Mapping[str, Any]) -> Any:
        value, key = target(env), index(env)
        if isinstance(value, list):
            if not isinstance(key, int) or isinstance(key, bool):
                raise CelError("no such overload")
            if not 0 <= key < len(value):
                raise CelError(f"index out of bounds: {key}")
            return value[key]
        if isinstance(value, dict):
            if key not in value:
                raise CelError(f"no such key: {key}")
            return value[key]
        raise CelError("no such overload")

    return lookup


def _or(left: Program, right: Program) -> Program:
    def either(env: Mapping[str, Any]) -> Any:
        try:
            first = left(env)
        except CelError as e:
            error: CelError | None = e
            first = None
        else:
            error = None
            if first is True:
                return True
            if first is not False:
                error = CelError("no such overload")
        second = right(env)  # its error, if any, wins over a false or erroneous left
        if second is True:
            return True
        if second is not False:
            raise CelError("no such overload")
        if error is not None:
            raise error
        return False

    return either


def _and(left: Program, right: Program) -> Program:
    def both(env: Mapping[str, Any]) -> Any:
        try:
            first = left(env)
        except CelError as e:
            error: CelError | None = e
            first = None
        else:
            error = None
            if first is False:
                return False
            if first is not True:
                error = CelError("no such overload")
        second = right(env)
        if second is False:
            return False
        if second is not True:
            raise CelError("no such overload")
        if error is not None:
            raise error
        return True

    return both


def _relation(op: str, left: Program, right: Program) -> Program:
    if op == "==":
        return lambda env: cel_equal(left(env), right(env))
    if op == "!=":
        return lambda env: not cel_equal(left(env), right(env))
    if op == "in":

        def contains(env: Mapping[str, Any]) -> bool:
            item, collection = left(env), right(env)
            if isinstance(collection, list):
                return any(cel_equal(item, x) for x in collection)
            if isinstance(collection, dict):
                return item in collection
            raise CelError("no such overload")

        return contains
    return lambda env: _compare(op, left(env), right(env))


def _binary(op: str, left: Program, right: Program) -> Program:
    return lambda env: _arith(op, left(env), right(env))


def compile_fast(text: str) -> Program | None:
    """A Python closure for `text`, or None when the expression is outside the subset."""
    try:
        parser = _Parser(_tokens(text))
        program = parser.expression()
        if parser.position != len(parser.tokens):
            return None
    except (_Unsupported, RecursionError):
        return None
    return program
