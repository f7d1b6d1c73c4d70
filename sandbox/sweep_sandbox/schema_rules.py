"""x-kubernetes-validations rules (apiextensions-apiserver's cel/validation.go): compiled once per CRD version,
checked as the type-checked compile would, and evaluated with oldSelf, ratcheting and memoized results."""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .schema_cel import CelError, compile_fast
from .schema_errors import OMIT, FieldError
from .schema_nodes import Node, Rule, SchemaError, join_path

# --------------------------------------------------------------------------------------------------------------------
# CEL (pkg/apiserver/schema/cel/validation.go Validator.validateExpressions), evaluated by cel-python


_CEL_IDENT = re.compile(r"\b(self|oldSelf)((?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)+)")
_CEL_CALL = re.compile(r"(?<![\w$])\.?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_CEL_MACROS = {
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "duration",
    "timestamp",
    "dyn",
    "matches",
    "startsWith",
    "endsWith",
    "contains",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getMonth",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getSeconds",
    "list",
}


def _k8s_functions() -> dict[str, Callable[..., Any]]:
    """Kubernetes CEL library functions cel-python lacks (k8s.io/apiserver/pkg/cel/library: lists.go, strings)."""
    from celpy import celtypes

    return {**_list_functions(celtypes), **_string_functions(celtypes)}


def _list_functions(celtypes: Any) -> dict[str, Callable[..., Any]]:
    """library/lists.go, and indexOf/lastIndexOf on strings too (library/strings.go)."""

    def is_sorted(items: Any) -> Any:
        values = list(items)
        return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(values)))

    def list_sum(items: Any) -> Any:
        values = list(items)
        if not values:
            return celtypes.IntType(0)
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total

    def list_min(items: Any) -> Any:
        values = list(items)
        if not values:
            raise ValueError("min called on empty list")
        return min(values)

    def list_max(items: Any) -> Any:
        values = list(items)
        if not values:
            raise ValueError("max called on empty list")
        return max(values)

    def index_of(target: Any, item: Any) -> Any:
        if isinstance(target, str):
            return celtypes.IntType(str(target).find(str(item)))
        values = list(target)
        return celtypes.IntType(values.index(item) if item in values else -1)

    def last_index_of(target: Any, item: Any) -> Any:
        if isinstance(target, str):
            return celtypes.IntType(str(target).rfind(str(item)))
        values = list(target)
        return celtypes.IntType(len(values) - 1 - values[::-1].index(item) if item in values else -1)

    return {
        "isSorted": is_sorted,
        "sum": list_sum,
        "min": list_min,
        "max": list_max,
        "indexOf": index_of,
        "lastIndexOf": last_index_of,
    }


def _string_functions(celtypes: Any) -> dict[str, Callable[..., Any]]:
    """library/strings.go and regex.go."""

    def lower_ascii(text: Any) -> Any:
        return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in str(text)))

    def upper_ascii(text: Any) -> Any:
        return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in str(text)))

    def trim(text: Any) -> Any:
        return celtypes.StringType(str(text).strip())

    def split(text: Any, separator: Any) -> Any:
        return celtypes.ListType([celtypes.StringType(p) for p in str(text).split(str(separator))])

    def join(items: Any, separator: Any = "") -> Any:
        return celtypes.StringType(str(separator).join(str(i) for i in items))

    def replace(text: Any, old: Any, new: Any) -> Any:
        return celtypes.StringType(str(text).replace(str(old), str(new)))

    def find(text: Any, pattern: Any) -> Any:
        match = re.search(str(pattern), str(text))
        return celtypes.StringType(match.group(0) if match else "")

    def find_all(text: Any, pattern: Any) -> Any:
        return celtypes.ListType([celtypes.StringType(m.group(0)) for m in re.finditer(str(pattern), str(text))])

    return {
        "lowerAscii": lower_ascii,
        "upperAscii": upper_ascii,
        "trim": trim,
        "split": split,
        "join": join,
        "replace": replace,
        "find": find,
        "findAll": find_all,
    }


class CelCompiler:
    """Compiles x-kubernetes-validations rules once; refuses what the apiserver's type-checked compile refuses.

    cel-python only parses, so two checks stand in for cel-go's checker: every function must be known (CEL's
    standard ones or the Kubernetes library above) and every `self.a.b` chain must name declared properties
    (where the schema declares them: not through preserve-unknown, maps or int-or-string).
    """

    def __init__(self) -> None:
        import celpy

        logging.getLogger("celpy").setLevel(logging.CRITICAL)
        self._celpy = celpy
        self._interpreted_env = celpy.Environment()
        self.functions = _k8s_functions()
        self.known_functions = _CEL_MACROS | set(self.functions)

    def compile_rule(self, rule: Rule, node: Node, path: str) -> None:
        where = f"{path or '<root>'} x-kubernetes-validations {rule.rule!r}"
        rule.program = self._program(rule.rule, where)
        rule.fast = compile_fast(rule.rule)
        rule.uses_old_self = bool(re.search(r"\boldSelf\b", rule.rule))
        self._check_references(rule.rule, node, where)
        if rule.message_expression:
            rule.message_program = self._program(rule.message_expression, f"{where} messageExpression")
            rule.fast_message = compile_fast(rule.message_expression)
        if rule.field_path and not _valid_field_path(rule.field_path, node):
            raise SchemaError(f"{where}: fieldPath {rule.field_path!r} does not name a declared field")

    def _program(self, text: str, where: str) -> Any:
        for name in _CEL_CALL.findall(_strip_strings(text)):
            if name not in self.known_functions:
                raise SchemaError(f"{where}: undeclared reference to '{name}'")
        try:
            ast = self._interpreted_env.compile(text)
        except Exception as e:  # celpy's CELParseError
            raise SchemaError(f"{where}: compilation failed: {e}") from e
        # cel-python's CompiledRunner is faster but wrong on `!has(...)` (0.5.0): the interpreter only
        return self._interpreted_env.program(ast, functions=self.functions)

    @staticmethod
    def _check_references(text: str, node: Node, where: str) -> None:
        for _, chain in _CEL_IDENT.findall(_strip_strings(text)):
            current: Node | None = node
            for name in (p.strip() for p in chain.split(".") if p.strip()):
                if current is None or current.preserve_unknown or current.int_or_string or not current.type:
                    break
                if current.type != "object":
                    break  # a member call on a scalar or list (self.size()): the function check covers it
                if current.properties:
                    if name not in current.properties:
                        raise SchemaError(f"{where}: undefined field '{name}'")
                    current = current.properties[name]
                else:
                    current = current.additional
                    break

    def to_cel(self, value: Any) -> Any:
        return self._celpy.json_to_cel(value)


def _strip_strings(text: str) -> str:
    """The expression with its string literals blanked (a word in a message is no call)."""
    return re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", text)


def _valid_field_path(field_path: str, node: Node) -> bool:
    current: Node | None = node
    for name in (p for p in re.split(r"\.|\[[^\]]*\]", field_path) if p):
        if current is None:
            return False
        if current.properties and name in current.properties:
            current = current.properties[name]
            continue
        return bool(current.additional is not None or current.preserve_unknown)
    return True


def _normalized_field_path(field_path: str) -> str:
    return field_path.lstrip(".")


def _cel_error(rule: Rule, path: str, node: Node, detail: str, value: Any) -> FieldError:
    """cel/validation.go fieldErrorForReason."""
    if rule.reason == "FieldValueForbidden":
        return FieldError("FieldValueForbidden", path, detail=detail)
    if rule.reason == "FieldValueRequired":
        return FieldError("FieldValueRequired", path, detail=detail)
    if rule.reason == "FieldValueDuplicate":
        return FieldError("FieldValueDuplicate", path, value)
    return FieldError("FieldValueInvalid", path, node.cel_type, detail)


def _cel_error_text(error: Any) -> str:
    """cel-go's wording for the runtime errors a rule meets most (`no such key: metric`)."""
    if isinstance(error, CelError):
        text = str(error)
        if text == "no such overload":
            return "'no such overload': call arguments did not match a supported operator, function or macro signature"
        return text
    text = repr(getattr(error, "args", error))
    match = re.search(r"no such member in mapping: '([^']*)'", text)
    if match:
        return f"no such key: {match.group(1)}"
    if "no such overload" in text:
        return "'no such overload': call arguments did not match a supported operator, function or macro signature"
    strings = [a for a in getattr(error, "args", ()) if isinstance(a, str) and a != "evaluation error"]
    return strings[0] if strings else str(error)


def run_rules(
    value: Any,
    node: Node,
    path: str,
    errors: list[FieldError],
    cel: CelCompiler,
    old: Any = OMIT,
) -> None:
    """Evaluate every rule under `node` for `value`; non-transition rules on values unchanged from `old` are skipped.

    Skipping an unchanged value is the apiserver's ratcheting (cel/validation.go: a non-transition rule's error on
    a correlated, unchanged value is only a warning), less the warning.
    """
    if value is None:
        return
    unchanged = old is not OMIT and old == value
    if node.rules:
        rules = [r for r in node.rules if r.uses_old_self] if unchanged else node.rules
        if rules:
            _evaluate(value, node, rules, path, errors, cel, old)
    if unchanged or not node.rules_below:
        return
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            child = node.properties.get(key)
            child_path = join_path(path, key)
            if child is None and node.additional is not None:
                child, child_path = node.additional, f"{path}[{key}]"
            if child is not None and (child.rules or child.rules_below):
                run_rules(item, child, child_path, errors, cel, old_map.get(key, OMIT))
    elif isinstance(value, list) and node.items is not None:
        old_items = _correlate_list(old, node)
        for index, item in enumerate(value):
            key = _list_key(item, node)
            run_rules(
                item,
                node.items,
                f"{path}[{index}]",
                errors,
                cel,
                old_items.get(key, OMIT) if key is not None else OMIT,
            )


def _list_key(item: Any, node: Node) -> str | None:
    if node.list_type == "map" and node.list_map_keys and isinstance(item, dict):
        return json.dumps([item.get(k) for k in node.list_map_keys])
    return None


def _correlate_list(old: Any, node: Node) -> dict[str, Any]:
    """Old items by list-map key: only list-type=map items correlate (set and atomic lists do not)."""
    if not isinstance(old, list) or node.list_type != "map":
        return {}
    result = {}
    for item in old:
        key = _list_key(item, node)
        if key is not None:
            result[key] = item
    return result


_RESULTS: OrderedDict[tuple[Any, ...], list[FieldError]] = OrderedDict()
_RESULTS_LIMIT = 4096


def _evaluate(
    value: Any, node: Node, rules: list[Rule], path: str, errors: list[FieldError], cel: CelCompiler, old: Any
) -> None:
    """The rules' errors for this value, memoized: rules are pure, and cel-python's interpreter costs ~0.3 ms a rule
    (a thousand sweeps from one template pay for one)."""
    key = (
        id(node),
        len(rules),
        path,
        json.dumps(value, sort_keys=True),
        json.dumps(old, sort_keys=True) if old is not OMIT else None,
    )
    found = _RESULTS.get(key)
    if found is None:
        found = []
        _evaluate_now(value, node, rules, path, found, cel, old)
        _RESULTS[key] = found
        if len(_RESULTS) > _RESULTS_LIMIT:
            _RESULTS.popitem(last=False)
    else:
        _RESULTS.move_to_end(key)
    errors.extend(found)


def _evaluate_now(
    value: Any, node: Node, rules: list[Rule], path: str, errors: list[FieldError], cel: CelCompiler, old: Any
) -> None:
    has_old = old is not OMIT
    plain = {"self": value, "oldSelf": old} if has_old else {"self": value}
    activation: dict[str, Any] | None = None
    for rule in rules:
        if rule.uses_old_self and not has_old and not rule.optional_old_self:
            continue  # a transition rule runs only on an update with a correlated old value
        if rule.fast is None and activation is None:
            activation = {name: cel.to_cel(v) for name, v in plain.items()}
        try:
            result = rule.fast(plain) if rule.fast is not None else rule.program.evaluate(activation)
            if rule.fast is not None and not isinstance(result, bool):
                raise CelError("no such overload")
        except Exception as e:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    node.cel_type,
                    f"{_cel_error_text(e)} evaluating rule: {rule.error_string()}",
                )
            )
            continue
        if isinstance(result, Exception):
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    node.cel_type,
                    f"{_cel_error_text(result)} evaluating rule: {rule.error_string()}",
                )
            )
            continue
        if bool(result):
            continue
        detail = rule.default_message()
        if rule.message_program is not None:
            try:
                if rule.fast_message is not None:
                    message = rule.fast_message(plain)
                else:
                    activation = activation or {name: cel.to_cel(v) for name, v in plain.items()}
                    message = rule.message_program.evaluate(activation)
                if isinstance(message, str) and message.strip() and "\n" not in message:
                    detail = message.strip()
            except Exception:
                pass  # messageExpression failures fall back to message (as the apiserver logs and does)
        field_path = path
        if rule.field_path:
            field_path = join_path(path, _normalized_field_path(rule.field_path))
        errors.append(_cel_error(rule, field_path, node, detail, value))
