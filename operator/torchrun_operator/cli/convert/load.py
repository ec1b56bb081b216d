"""The input of kubectl dtj convert: untrusted YAML or JSON, loaded within bounds.

A PyTorchJob is a Kubernetes object, so JSON: what YAML adds is refused or made plain.

- At most MAX_INPUT_BYTES, nested at most MAX_DEPTH deep, and at most MAX_VALUES values once
  every alias is expanded. Aliases are fine (a template shared by Master and Worker through
  an anchor), but an 800-byte "billion laughs" expands tenfold per level: the expanded size
  is counted from the parser's events, in one pass over them, before anything is built.
- An alias of a node that contains it (a cycle) is refused.
- A timestamp stays the string it was (as Kubernetes reads YAML); !!binary, !!set and other
  non-JSON values, keys that are not strings, and NaN or infinite numbers are refused.
- What is returned is plain data: no two places share an object, so nothing later walks an
  alias twice without knowing, and the YAML printed has no anchors.

Every refusal is a ConvertError of one line.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from .result import ConvertError

MAX_INPUT_BYTES = 1024 * 1024
"""An object in etcd is at most 1.5 MiB; a PyTorchJob is a few KiB."""
MAX_DEPTH = 100
"""Nesting: a PyTorchJob's deepest fields (affinity terms) are about 20 deep."""
MAX_VALUES = 100_000
"""Every scalar, list and mapping, keys included, once aliases are expanded: a PyTorchJob
has hundreds."""


class _Loader(yaml.SafeLoader):
    """SafeLoader, but a timestamp is the string it was: Kubernetes reads YAML as JSON."""


def _timestamp_as_str(loader: _Loader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)  # the timestamp tag resolves on scalars only
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_str)


def _where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def one_line(e: yaml.YAMLError) -> str:
    """PyYAML's error without the quoted source lines it adds."""
    if isinstance(e, yaml.MarkedYAMLError):
        what = " ".join(p for p in (e.context, e.problem) if p) or "not valid YAML"
        return f"{_where(e)}{what}"
    return " ".join(str(e).split())


def _measure(text: str) -> None:
    """Refuses, from the parser's events alone, a stream too deeply nested or too large once
    its aliases are expanded, or with an alias of a node that contains it. Linear in the
    events: each anchor's expanded size is kept, an alias adds it."""
    loader = _Loader(text)
    try:
        sizes: dict[str, int | None] = {}  # anchor -> expanded size; None while it is open
        stack: list[list[Any]] = []  # [size so far, anchor] of each open collection
        total = 0
        while loader.check_event():
            event: yaml.Event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.DocumentStartEvent):
                sizes = {}  # anchors are the document's own
                continue
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise ConvertError(
                        f"{_where_event(event)}nested more than {MAX_DEPTH} deep: not a "
                        "PyTorchJob this command reads"
                    )
                if event.anchor is not None:
                    sizes[event.anchor] = None
                stack.append([1, event.anchor])
                total += 1
                n, anchor = 0, None
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                n, anchor = stack.pop()  # counted in total as its values came
                if anchor is not None:
                    sizes[anchor] = n
                if stack:
                    stack[-1][0] += n
                continue
            elif isinstance(event, yaml.ScalarEvent):
                n, anchor = 1, event.anchor
                total += 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    raise ConvertError(f"{_where_event(event)}alias *{event.anchor} is undefined")
                size = sizes[event.anchor]
                if size is None:
                    raise ConvertError(
                        f"{_where_event(event)}alias *{event.anchor} is inside the node it "
                        "names: the node contains itself"
                    )
                n, anchor = size, None
                total += size
            else:
                continue
            if total > MAX_VALUES:
                raise ConvertError(
                    f"{_where_event(event)}more than {MAX_VALUES} values once its aliases are "
                    "expanded: not a PyTorchJob this command reads (an alias bomb?)"
                )
            if anchor is not None:
                sizes[anchor] = n
            if stack and n:
                stack[-1][0] += n
    finally:
        loader.dispose()


def _where_event(event: yaml.Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _plain(value: Any, path: str) -> Any:
    """A fresh copy of a loaded value as JSON data, or a ConvertError naming where it is not.
    Bounded by _measure: it walks at most MAX_VALUES values, at most MAX_DEPTH deep."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConvertError(
                    f"{path or 'the document'}: the key {k!r} is not a string (a Kubernetes "
                    "object is JSON): quote it"
                )
            out[k] = _plain(v, f"{path}.{k}" if path else k)
        return out
    if isinstance(value, list):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConvertError(f"{path}: {value} is not a JSON number")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConvertError(
        f"{path}: a YAML {type(value).__name__} is not a JSON value (a Kubernetes object is JSON)"
    )


def load(text: str) -> list[Any]:
    """The documents of a YAML or JSON stream, as plain JSON data, within the bounds above."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
        raise ConvertError(
            f"the input is more than {MAX_INPUT_BYTES} bytes: not a PyTorchJob this command reads"
        )
    try:
        _measure(text)
        loaded = list(yaml.load_all(text, Loader=_Loader))  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise ConvertError(f"not valid YAML: {one_line(e)}") from None
    except ConvertError:
        raise
    except ValueError as e:  # PyYAML's int() of a number past Python's 4300 digits
        raise ConvertError(f"a number too long to read: {' '.join(str(e).split())[:200]}") from None
    return [_plain(d, "") for d in loaded]


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a YAML or JSON stream (a List's items included), loaded within bounds
    (load)."""
    docs: list[dict[str, Any]] = []
    for doc in load(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise ConvertError("the input is not a Kubernetes object")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            for i, item in enumerate(doc["items"]):
                if not isinstance(item, dict):
                    raise ConvertError(
                        f"items[{i}] of the {doc['kind']} is not a Kubernetes object"
                    )
                docs.append(item)
        else:
            docs.append(doc)
    return docs
