"""Volumes: what files a volume holds (pure: `volume_files`) and materialising them on the
host under the pod's directory (`prepare`), plus each container's bind-mount list."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .env import ConfigError, Lookup, PodFacts, field_value, object_bytes, resource_value

# (serviceAccountName, audience or None, expirationSeconds) -> token
TokenFn = Callable[[str, str | None, int], str]
Files = dict[str, tuple[bytes, int]]  # relative path -> (content, mode)


def _items(
    kind: str, data: Mapping[str, bytes], src: Mapping[str, Any], default_mode: int, name: str
) -> Files:
    optional = bool(src.get("optional"))
    out: Files = {}
    items = src.get("items")
    if items is None:
        return {k: (v, default_mode) for k, v in data.items()}
    for it in items:
        if it["key"] not in data:
            if optional:
                continue
            raise ConfigError(f'configmap/secret "{name}": key {it["key"]!r} not found')
        out[it["path"]] = (data[it["key"]], int(it.get("mode", default_mode)))
    return out


def _keyed(
    kind: str, src: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup, default_mode: int
) -> Files:
    name = src.get("name") or src.get("secretName") or ""
    ns = pod.get("metadata", {}).get("namespace", "default")
    obj = lookup(kind, ns, name)
    if obj is None:
        if src.get("optional"):
            return {}
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    return _items(kind, object_bytes(kind, obj), src, default_mode, name)


def _downward(
    items: list[Mapping[str, Any]], pod: Mapping[str, Any], facts: PodFacts, default_mode: int
) -> Files:
    out: Files = {}
    for it in items:
        if "fieldRef" in it:
            value = field_value(pod, it["fieldRef"]["fieldPath"], facts)
        elif "resourceFieldRef" in it:
            ref = it["resourceFieldRef"]
            value = resource_value(pod, ref.get("containerName", ""), ref, facts)
        else:
            raise ConfigError(f"downwardAPI item {it.get('path')}: no fieldRef/resourceFieldRef")
        out[it["path"]] = (value.encode(), int(it.get("mode", default_mode)))
    return out


def volume_files(
    vol: Mapping[str, Any], pod: Mapping[str, Any], facts: PodFacts, lookup: Lookup, token: TokenFn
) -> Files | None:
    """Files of a content volume; None for volumes that are directories (emptyDir, hostPath)."""
    if "configMap" in vol:
        src = vol["configMap"]
        return _keyed("ConfigMap", src, pod, lookup, int(src.get("defaultMode", 0o644)))
    if "secret" in vol:
        src = vol["secret"]
        return _keyed("Secret", src, pod, lookup, int(src.get("defaultMode", 0o644)))
    if "downwardAPI" in vol:
        src = vol["downwardAPI"]
        return _downward(src.get("items") or [], pod, facts, int(src.get("defaultMode", 0o644)))
    if "projected" in vol:
        src = vol["projected"]
        mode = int(src.get("defaultMode", 0o644))
        out: Files = {}
        sa = pod.get("spec", {}).get("serviceAccountName") or "default"
        for s in src.get("sources") or []:
            if "serviceAccountToken" in s:
                t = s["serviceAccountToken"]
                value = token(sa, t.get("audience"), int(t.get("expirationSeconds", 3600)))
                out[t["path"]] = (value.encode(), 0o600 if "defaultMode" not in src else mode)
            elif "configMap" in s:
                out.update(_keyed("ConfigMap", s["configMap"], pod, lookup, mode))
            elif "secret" in s:
                out.update(_keyed("Secret", s["secret"], pod, lookup, mode))
            elif "downwardAPI" in s:
                out.update(_downward(s["downwardAPI"].get("items") or [], pod, facts, mode))
            else:
                raise ConfigError(f"projected source {sorted(s)} is not supported")
        return out
    if "emptyDir" in vol or "hostPath" in vol:
        return None
    kinds = sorted(k for k in vol if k != "name")
    raise ConfigError(f"volume {vol.get('name')}: type {kinds} is not supported here")


@dataclass
class PodVolumes:
    """Host paths of a pod's volumes and the tmpfs mounts to undo at teardown."""

    paths: dict[str, Path] = field(default_factory=dict)
    tmpfs: list[Path] = field(default_factory=list)

    def teardown(self) -> None:
        for p in self.tmpfs:
            subprocess.run(["umount", "-l", str(p)], capture_output=True)
        self.tmpfs.clear()


def write_files(root: Path, files: Files) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in files.items():
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ConfigError(f"volume file path {rel!r} must be relative and stay inside")
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)


def prepare(
    pod: Mapping[str, Any],
    pod_dir: Path,
    facts: PodFacts,
    lookup: Lookup,
    token: TokenFn,
    existing: PodVolumes | None = None,
) -> PodVolumes:
    vols = existing or PodVolumes()
    for vol in pod.get("spec", {}).get("volumes") or []:
        name = vol["name"]
        if "hostPath" in vol:
            hp = vol["hostPath"]
            path = Path(hp["path"])
            if hp.get("type") in ("DirectoryOrCreate",) and not path.exists():
                path.mkdir(parents=True)
            elif hp.get("type") == "FileOrCreate" and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            vols.paths[name] = path
            continue
        host = pod_dir / "volumes" / name
        files = volume_files(vol, pod, facts, lookup, token)
        if files is None:  # emptyDir
            if name not in vols.paths:
                host.mkdir(parents=True, exist_ok=True)
                host.chmod(0o777)
                ed = vol.get("emptyDir") or {}
                if ed.get("medium") == "Memory":
                    opts = "mode=1777" + (f",size={ed['sizeLimit']}" if ed.get("sizeLimit") else "")
                    subprocess.run(
                        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(host)],
                        check=True,
                        capture_output=True,
                    )
                    vols.tmpfs.append(host)
        else:
            write_files(host, files)
        vols.paths[name] = host
    return vols


def container_mounts(container: Mapping[str, Any], vols: PodVolumes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in vols.paths:
            raise ConfigError(f"volumeMount {vm['name']!r}: no such volume")
        source = vols.paths[vm["name"]]
        if vm.get("subPath"):
            source = source / vm["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        out.append(
            {
                "source": str(source),
                "target": vm["mountPath"],
                "readOnly": bool(vm.get("readOnly")),
                "file": source.is_file(),
            }
        )
    return out
