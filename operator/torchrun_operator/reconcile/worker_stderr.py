"""The message of a worker that failed without recording an error: what the launcher's report
quotes of its stderr (`failures[].stderr`, docs/pod-contract.md), with a hint where that shows a
launch-era script asking for the `--local-rank` argument torch.distributed.launch passed it.

Pure: rootcause.py calls `failure_message` for each failure record of a report.
"""

from __future__ import annotations

import re

from ..launcher import contract

# Room for the event's prefix ("rank 3 (pod ..., index 1, ...) failed: NonZeroExit, exit code
# 2: ") within observe.MAX_MESSAGE, so the quoted stderr's last line survives there too.
MESSAGE_LIMIT = 400

LOCAL_RANK_HINT = (
    "hint: the script's argparse expects the --local_rank/--local-rank argument "
    "torch.distributed.launch passed; set spec.torchrun.localRankArg to the spelling it "
    "declares (docs/migrating.md)"
)

# argparse's words when the argument is missing, or when it got the other spelling.
_LOCAL_RANK_MISSING = re.compile(
    r"the following arguments are required:.*--local[-_]rank\b"
    r"|unrecognized arguments:.*--local[-_]rank\b"
)


def local_rank_hint(stderr: str) -> str | None:
    """LOCAL_RANK_HINT when argparse's error in ``stderr`` is about --local-rank."""
    return LOCAL_RANK_HINT if _LOCAL_RANK_MISSING.search(stderr) else None


def _last_lines(text: str, limit: int) -> str:
    """The end of ``text`` in at most ``limit`` characters, from a line start where one fits."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    cut = text[len(text) - limit :]
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut


def failure_message(
    error: object, stderr: object, limit: int = MESSAGE_LIMIT, says: str | None = None
) -> str | None:
    """A failure record's message: its ``error``; when the record carries a stderr tail (only
    when the worker recorded no error), the hint it calls for on the first line and the tail's
    last lines below, within ``limit`` characters. ``says``: the stderr's line that tells what
    failed (reconcile/failurekinds.py: an NCCL watchdog's timeout, a device error), put on
    the first line, where the tail's end may have lost it; otherwise the first line stays
    free of the stderr's own text (crash-loop signatures compare first lines)."""
    text = str(error) if error else ""
    tail = stderr.strip() if isinstance(stderr, str) else ""
    tail = tail[-contract.STDERR_TAIL_LIMIT :]
    if not tail:
        return text or None
    hint = local_rank_hint(tail)
    head = f"{text or 'failed'} ({hint})" if hint else (text or "failed")
    if says and says not in text:
        head += f": {says}"
    head += "\nstderr ends:\n"
    if len(head) >= limit:
        return head.rstrip()[:limit]
    return head + _last_lines(tail, limit - len(head))
