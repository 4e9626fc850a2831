"""DynamoDB: requests and bytes per step against one bare PutItem per step, in one run.

    python3 dev.py bench dynamodb [--steps 200]
    .venv/bin/python bench/bench_dynamodb.py [--steps 200]   (a venv with pip install -e '.[bench]')

Workload (bench_sqlite.py's ``Chat``/``append_step``/``messages``): one run of
``--steps`` steps, each appending a 1 KB message, on moto's server (started here
on a free loopback port, as the tests do). Requests and request bytes are counted
with a botocore event hook on the store's own client; the floor is ONE bare
``PutItem`` per step of the same message into the same table. Shown without a
lease (``busy=None``) and with one held (``busy="queue"``, the default): taking
and releasing the lease (outside the loop) are printed on their own. Times are
not shown: moto is not DynamoDB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _env  # noqa: F401 -- first: a missing package says how to run this script
from bench_sqlite import Chat, append_step, messages

import persistkit as pk
from persistkit.backends.dynamodb import make_client

HERE = Path(__file__).resolve().parent


class Counter:
    """Requests and request-body bytes per DynamoDB operation, from botocore's events."""

    def __init__(self, client: Any) -> None:
        self.ops: dict[str, int] = {}
        self.bytes = 0
        client.meta.events.register("before-send.dynamodb", self._sent)

    def _sent(self, request: Any, **_: Any) -> None:
        op = str(request.headers.get("X-Amz-Target", b"?"), "ascii", "replace").split(".")[-1]
        self.ops[op] = self.ops.get(op, 0) + 1
        self.bytes += len(request.body or b"")

    def reset(self) -> None:
        self.ops, self.bytes = {}, 0

    @property
    def requests(self) -> int:
        return sum(self.ops.values())


def _server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, str(HERE.parent / "tests" / "moto_s3.py"), "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("moto's server did not start") from None
            time.sleep(0.05)


def run(url: str, msgs: list[dict[str, str]], busy: str | None) -> tuple[Counter, dict[str, int]]:
    client = make_client(url.split("endpoint_url=")[1].split("&")[0], "us-east-1")
    counter = Counter(client)
    store = pk.connect(url, client=client)
    outside: dict[str, int] = {}
    with pk.resume(f"bench-{uuid.uuid4().hex[:8]}", store=store, state=Chat, busy=busy):  # type: ignore[arg-type]
        outside["open (lease taken, head read)"] = counter.requests
        counter.reset()
        for m in msgs:
            append_step(m)
        steps = Counter.__new__(Counter)
        steps.ops, steps.bytes = dict(counter.ops), counter.bytes
        counter.reset()
    outside["close (end record, lease released)"] = counter.requests
    store.close()
    return steps, outside


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    msgs = messages(args.steps)
    proc, endpoint = _server()
    try:
        table = f"bench-{uuid.uuid4().hex[:8]}"
        url = f"dynamodb://{table}?endpoint_url={endpoint}&region=us-east-1&create=1"
        pk.connect(url).close()
        client = make_client(endpoint, "us-east-1")
        floor = Counter(client)
        for i, m in enumerate(msgs):
            body = json.dumps(m).encode()
            client.put_item(
                TableName=table,
                Item={"p": {"S": "floor"}, "s": {"S": f"{i:06d}"}, "v": {"B": body}},
            )
        print(
            f"DynamoDB (moto), {args.steps} steps of a 1 KB message; floor: one bare PutItem per step"
        )
        print(
            f"  {'':34} {'requests/step':>14} {'x floor':>8} {'bytes/step':>11} {'x floor':>8}  operations"
        )
        base_req, base_bytes = floor.requests / args.steps, floor.bytes / args.steps
        print(
            f"  {'bare PutItem':34} {base_req:14.2f} {1.0:8.2f} {base_bytes:11.0f} {1.0:8.2f}  {floor.ops}"
        )
        for label, busy in (
            ("persistkit, no lease (busy=None)", None),
            ("persistkit, lease held (queue)", "queue"),
        ):
            steps, outside = run(url, msgs, busy)
            req, byt = steps.requests / args.steps, steps.bytes / args.steps
            print(
                f"  {label:34} {req:14.2f} {req / base_req:8.2f} {byt:11.0f} {byt / base_bytes:8.2f}  {steps.ops}"
            )
            print(f"  {'':34} outside the loop: {outside}")
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
