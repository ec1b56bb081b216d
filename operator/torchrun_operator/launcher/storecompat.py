"""torch builds whose TCPStore has no libuv backend.

Since torch 2.4 the c10d store asks for libuv unless `USE_LIBUV=0`, and a torch built without
it (Debian's python3-torch, some source and conda builds) refuses: "use_libuv was requested
but PyTorch was build without libuv support", so torchrun cannot rendezvous at all (torch
2.6's c10d rendezvous backend does not even read `USE_LIBUV`). The launcher asks the store
once, on loopback, before the agent starts, and when libuv is missing chooses the classic
backend: `USE_LIBUV=0` for the agent's and the workers' stores (unless the user set it), and
for the rendezvous store, which ignores that variable, by the argument.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from .logline import log

ENV_USE_LIBUV = "USE_LIBUV"


def libuv_missing() -> bool:
    """Whether this torch's TCPStore refuses libuv (a listening socket on 127.0.0.1, freed
    at once; no peer is waited for)."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    except TypeError:  # torch before the libuv option (2.1): one backend, nothing to choose
        return False
    except RuntimeError as e:
        return "libuv" in str(e)
    del store
    return False


def choose_store_backend(environ: MutableMapping[str, str]) -> None:
    """When libuv is missing: USE_LIBUV=0 in `environ` (the agent's, which its workers
    inherit) unless the user set it, and the rendezvous backend's stores without libuv."""
    if environ.get(ENV_USE_LIBUV) == "1" or not libuv_missing():
        return
    environ.setdefault(ENV_USE_LIBUV, "0")
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend

    store = backend.TCPStore

    def classic_store(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("use_libuv", False)
        return store(*args, **kwargs)

    backend.TCPStore = classic_store  # type: ignore[assignment, misc]
    log("this torch has no libuv: the c10d stores use the classic backend", USE_LIBUV="0")
