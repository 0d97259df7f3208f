"""`sapo-node health`: ask a running node's `/healthz`; exit 0 when it is healthy, 1 when not or when it is silent.

The image's HEALTHCHECK runs it, and so can a systemd timer.
"""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request
from pathlib import Path

from sapo.node.status import read_status
from sapo.node.web import INSTANCE_HEADER

DEFAULT_PAGE = "http://127.0.0.1:31338/"  # a node's page with the default --status_port and --status_host
TIMEOUT_SECONDS = 5.0


def where_to_ask(output_dir: str | Path | None, url: str | None) -> tuple[str, str | None]:
    """Where to ask, and which node process must answer: ``url`` when given (any node answering counts); else the
    page and ``instance`` the node in ``output_dir`` recorded in its status.json (it may have moved to a free port;
    an older node records no instance); else the default page address."""
    if url:
        return url, None
    status = read_status(output_dir) if output_dir is not None else {}
    return status.get("page") or DEFAULT_PAGE, status.get("instance") or None


def ask(page: str, timeout: float = TIMEOUT_SECONDS, instance: str | None = None) -> tuple[bool, str]:
    """(healthy, what the node says) of the node whose page is at ``page``: healthy when `/healthz` answers 200
    (`ok`, or `degraded` while it trains alone); not when it answers 503 (stalled, transport down) or nothing, nor
    when ``instance`` is given and the page is another node process's (its `X-Sapo-Instance` differs: the node left
    and another took its port)."""
    url = page.rstrip("/") + "/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            healthy, answered = True, response.headers.get(INSTANCE_HEADER)
            text = response.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as e:
        healthy, answered = False, e.headers.get(INSTANCE_HEADER)
        text = e.read().decode(errors="replace").strip() or f"HTTP {e.code}"
    except (OSError, ValueError) as e:  # refused, timed out, no route, a malformed address
        reason = getattr(e, "reason", e)
        return False, (
            f"unhealthy\nthe node's page at {page} does not answer ({reason}): the node is not running, is frozen, "
            "or serves its page elsewhere (--status_port)"
        )
    if instance is not None and answered != instance:
        return False, (
            f"unhealthy\nthe page at {page} is another node process's, not the one this output directory's "
            "status.json names: that node is not running (another took its port)"
        )
    return healthy, text


def main(argv: list[str]) -> int:
    """`sapo-node health [--output-dir DIR] [--url URL]`: print the node's health; 0 when healthy, else 1."""
    parser = argparse.ArgumentParser(
        prog="sapo-node health",
        description="Ask a running node whether it is healthy (its /healthz): exit code 0 when it is (ok, or "
        "degraded while training alone), 1 when it is stalled, its swarm transport is down, or it does not answer. "
        "The image's HEALTHCHECK runs it.",
    )
    parser.add_argument(
        "--output-dir", "--output_dir", default=".", help="the node's output directory: its status.json says where "
        "its page is (default: the current directory; with no status.json there, " + DEFAULT_PAGE + ")",
    )  # fmt: skip
    parser.add_argument("--url", default=None, help="the node's page address, e.g. " + DEFAULT_PAGE)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECONDS, help="seconds to wait for an answer")
    args = parser.parse_args(argv)
    page, instance = where_to_ask(args.output_dir, args.url)
    healthy, text = ask(page, args.timeout, instance)
    print(text, flush=True)
    return 0 if healthy else 1
