"""The shape of a PyTorchJob (kubeflow.org/v1), checked before it is mapped.

Every field the mapping reads has the type Kubeflow's CRD gives it (strictly: "2" is not an
integer, nor is true); the mapping then works on the plain data, trusting these types. Fields
it does not read are left alone (they pass through, or are warned about, as they are).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .result import ConvertError


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Env(_Loose):
    name: str = ""


class _Resources(_Loose):
    limits: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None


class _Container(_Loose):
    name: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[_Env] | None = None
    resources: _Resources | None = None


class _PodSpec(_Loose):
    containers: list[_Container] | None = None
    restartPolicy: str | None = None  # noqa: N815 (the wire's name)
    schedulerName: str | None = None  # noqa: N815
    priorityClassName: str | None = None  # noqa: N815


class _Template(_Loose):
    metadata: dict[str, Any] | None = None
    spec: _PodSpec | None = None


class _Replica(_Loose):
    replicas: int | None = None
    restartPolicy: str | None = None  # noqa: N815
    template: _Template | None = None


class _RdzvConf(_Loose):
    key: str
    value: str | int | None = None


class _ElasticPolicy(_Loose):
    minReplicas: int | None = None  # noqa: N815
    maxReplicas: int | None = None  # noqa: N815
    maxRestarts: int | None = None  # noqa: N815
    rdzvBackend: str | None = None  # noqa: N815
    rdzvPort: int | None = None  # noqa: N815
    rdzvHost: str | None = None  # noqa: N815
    rdzvId: str | None = None  # noqa: N815
    rdzvConf: list[_RdzvConf] | None = None  # noqa: N815
    standalone: bool | None = None
    nProcPerNode: int | None = None  # noqa: N815


class _SchedulingPolicy(_Loose):
    minAvailable: int | None = None  # noqa: N815
    queue: str | None = None
    minResources: dict[str, Any] | None = None  # noqa: N815
    priorityClass: str | None = None  # noqa: N815
    scheduleTimeoutSeconds: int | None = None  # noqa: N815


class _RunPolicy(_Loose):
    cleanPodPolicy: str | None = None  # noqa: N815
    ttlSecondsAfterFinished: int | None = None  # noqa: N815
    activeDeadlineSeconds: int | None = None  # noqa: N815
    backoffLimit: int | None = None  # noqa: N815
    suspend: bool | None = None
    managedBy: str | None = None  # noqa: N815
    schedulingPolicy: _SchedulingPolicy | None = None  # noqa: N815


class _Spec(_Loose):
    pytorchReplicaSpecs: dict[str, _Replica] | None = None  # noqa: N815
    runPolicy: _RunPolicy | None = None  # noqa: N815
    elasticPolicy: _ElasticPolicy | None = None  # noqa: N815
    nprocPerNode: str | int | None = None  # noqa: N815 (a string in v1; 4 unquoted is meant)


class _Metadata(_Loose):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class PyTorchJob(_Loose):
    metadata: _Metadata | None = None
    spec: _Spec | None = None


_TYPES = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "list_type": "a list",
    "model_type": "a mapping",
    "missing": "required",
}


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "int") or "[" in part:
            continue  # which member of a union pydantic tried: not a place in the document
        else:
            out += f".{part}" if out else part
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(doc: dict[str, Any]) -> None:
    """Raises a ConvertError naming the first field (or first few) of the wrong type."""
    try:
        PyTorchJob.model_validate(doc)
    except ValidationError as e:
        seen: dict[str, str] = {}
        for err in e.errors():
            where = _path(err["loc"])
            want = _TYPES.get(err["type"], err["msg"])
            if err["type"] == "missing":
                text = f"{where}: required"
            else:
                text = f"{where}: must be {want}, not {_shown(err['input'])}"
            seen.setdefault(where, text)  # one per place: a union reports each member
        shown = list(seen.values())
        more = f" (and {len(shown) - 3} more)" if len(shown) > 3 else ""
        raise ConvertError("; ".join(shown[:3]) + more) from None
