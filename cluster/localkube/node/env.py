"""Pure resolution of a container's environment, as a kubelet does it.

Everything here is a function of the pod object, the node's facts and a lookup for
ConfigMaps/Secrets (injected, so tests pass a dict). A missing required reference raises
`ConfigError`, which the caller reports as `CreateContainerConfigError`.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

# (kind, namespace, name) -> the object as a dict, or None when it does not exist.
Lookup = Callable[[str, str, str], dict[str, Any] | None]


class ConfigError(Exception):
    """A container cannot be configured (missing ConfigMap key, bad fieldRef...)."""


@dataclass(frozen=True)
class PodFacts:
    """What the node knows about a pod beyond its spec."""

    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, str] = field(default_factory=dict)


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: `$$` escapes a dollar, unknown variables stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, text)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")


def field_value(pod: Mapping[str, Any], path: str, facts: PodFacts) -> str:
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")


def resource_value(
    pod: Mapping[str, Any], container_name: str, ref: Mapping[str, Any], facts: PodFacts
) -> str:
    """`resourceFieldRef`: limits fall back to node allocatable, requests to limits, like
    the kubelet; the value is rounded up to a whole number of divisors."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise ConfigError(f"unsupported resourceFieldRef resource {resource!r}")
    containers = pod.get("spec", {}).get("containers", []) + pod.get("spec", {}).get(
        "initContainers", []
    )
    target = ref.get("containerName") or container_name
    found = next((c for c in containers if c.get("name") == target), None)
    if found is None:
        raise ConfigError(f"resourceFieldRef names unknown container {target!r}")
    res = found.get("resources") or {}
    raw = (res.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (res.get("limits") or {}).get(name)
    if raw is None:
        raw = facts.node_allocatable.get(name, "0") if kind == "limits" else "0"
    value: Decimal = parse_quantity(str(raw))
    divisor: Decimal = parse_quantity(str(ref.get("divisor") or "1"))
    if divisor == 0:
        raise ConfigError("resourceFieldRef divisor must not be zero")
    return str(math.ceil(value / divisor))


def _source_data(
    lookup: Lookup, kind: str, namespace: str, name: str, optional: bool
) -> dict[str, str] | None:
    obj = lookup(kind, namespace, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    return object_data(kind, obj)


def object_bytes(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """The data of a ConfigMap or Secret as bytes, as a volume holds them: a Secret's and a
    ConfigMap's binaryData arrive base64 encoded and need not be text (a gzip, a keystore)."""
    if kind == "Secret":
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        data.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
        return data
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def object_data(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """The string data of a ConfigMap or Secret, for environment variables (a value that is
    not UTF-8 is decoded with replacement characters)."""
    return {k: v.decode(errors="replace") for k, v in object_bytes(kind, obj).items()}


def _key_ref(lookup: Lookup, kind: str, namespace: str, ref: Mapping[str, Any]) -> str | None:
    optional = bool(ref.get("optional"))
    data = _source_data(lookup, kind, namespace, ref.get("name", ""), optional)
    if data is None:
        return None
    key = ref.get("key", "")
    if key not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {key} in {kind} {namespace}/{ref.get('name')}")
    return data[key]


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    facts: PodFacts,
    lookup: Lookup,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one container: `base` (node-provided), then `envFrom` in order,
    then `env` in order, each `value` expanded against what is defined before it."""
    namespace = pod.get("metadata", {}).get("namespace", "default")
    env: dict[str, str] = dict(base or {})
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(key)
            if ref is None:
                continue
            optional = bool(ref.get("optional"))
            data = _source_data(lookup, kind, namespace, ref.get("name", ""), optional)
            for k, v in (data or {}).items():
                env[prefix + k] = v
    name = container.get("name", "")
    for var in container.get("env") or []:
        value: str | None
        if "valueFrom" in var:
            src = var["valueFrom"]
            if "fieldRef" in src:
                value = field_value(pod, src["fieldRef"].get("fieldPath", ""), facts)
            elif "resourceFieldRef" in src:
                value = resource_value(pod, name, src["resourceFieldRef"], facts)
            elif "configMapKeyRef" in src:
                value = _key_ref(lookup, "ConfigMap", namespace, src["configMapKeyRef"])
            elif "secretKeyRef" in src:
                value = _key_ref(lookup, "Secret", namespace, src["secretKeyRef"])
            else:
                raise ConfigError(f"env {var.get('name')}: unsupported valueFrom {sorted(src)}")
            if value is None:
                continue
        else:
            value = expand(var.get("value", ""), env)
        env[var["name"]] = value
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expansion; an image's entrypoint does not exist here."""
    argv = [expand(a, env) for a in (container.get("command") or [])]
    argv += [expand(a, env) for a in (container.get("args") or [])]
    if not argv:
        raise ConfigError("container has no command: images are not run, so one is required")
    return argv
