"""The base of every API model: camelCase on the wire, unknown fields refused (or kept, for
the Kubernetes objects we only partly type), and CEL rules beside the Python checks. Its own
module so that the models (api/template.py, api/spec.py, api/status.py, api/scheduling.py,
api/runtime.py) all build on it without importing each other."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Rule(NamedTuple):
    """One CEL rule for the CRD (x-kubernetes-validations); its message is also the one the
    Python check raises, so both sides say the same thing."""

    rule: str
    message: str
    field_path: str | None = None

    def schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _model_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.schema() for r in rules]


def _open_model_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    schema["x-kubernetes-preserve-unknown-fields"] = True
    _model_rules(schema, cls)


class _Wire(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        json_schema_extra=_model_rules,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()


class _Open(_Wire):
    """A Kubernetes object we only partly type; everything else is kept as given (and kept in
    the schema: x-kubernetes-preserve-unknown-fields). The rest of _Wire's config holds."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_open_model_rules)
