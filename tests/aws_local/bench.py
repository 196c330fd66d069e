"""tests/aws-local --bench: the deployed shape beside local-api, in one run, on one
DynamoDB Local (docs/BENCHMARK.md, "The deployed shape, on one machine").

    tests/aws-local --bench [--cycles N] [--clients C] [--rounds R] [--tickets T]
                            [--expiries E] [--stream-delays MS,MS] [--async-only]
                            [--burst N] [--release]

- borrow and return, N sequential cycles on one pool, then C clients doing R cycles each
  on a pool of C slots: p50/p99 of each call, through the front door and on local-api;
- return → callback: T tickets one after another on a pool of one slot (each enqueued
  while the slot is held; the return of the holder hands it on), for each stream delay
  of the stack (its --stream-delay-ms), and on local-api (its own stream reader);
- expiry → callback: E tickets one after another on a pool of one slot, each enqueued
  while the slot is held by a lease left to expire (no write says it ended: only the wake
  the dispatcher armed for it can deliver the grant), for each stream delay;
- what one delivered ticket costs the stack: dispatcher invocations, wake messages sent
  (SendMessage, by any function) and received by the queue's event source, DynamoDB
  calls by action, and the write and read units DynamoDB bills for them (`*_wcu`,
  `*_rcu`: the IAM proxy's count, a failed conditional write at its item's size; admin
  /stats and /calls).

--async-only skips the borrow and return figures and local-api.

--burst N runs, after the rest, the async burst (tests/bench's `burst`: N enqueues, 32 in
flight, on a pool of count 10 whose receivers hold 50 ms and return) against the stack at
the first stream delay, and adds what one ticket cost the stack (admin /stats, /calls).

--release runs the burst on release builds of the functions and of the burst client, as
they are deployed (the stack's --bin-dir).

Prints the figures and writes them as JSON to target/aws-local/bench.json. Both sides run
the same debug build the tests use, but for the burst with --release.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import launch
from .conftest import request
from .receiver import Receiver

ROOT = launch.ROOT
OUT = ROOT / "target" / "aws-local"
# After an enqueue, the stream's record of it is handled (delay, poll, the step) before the
# next return, so that the return → callback figure is that hand-off alone.
SETTLE_S = 1.0
# The tickets' leases: short, so that the wakes sent for their expiries arrive within the
# run and their invocations are counted too (each holder returns within about SETTLE_S).
TICKET_TTL_S = 5
# The leases left to expire in the expiry run: the wake armed for the expiry is sent with a
# delay of whole seconds (SQS's), rounded down; the dispatcher waits out the rest.
EXPIRY_TTL_S = 2
# Tickets handed on before the return → callback figures count: the first invocations of
# each function start its sandboxes (cold starts, counted apart), as the sync run's warm
# cycles do.
WARM_TICKETS = 5


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(at(0.99) * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def timed(url: str, method: str, body: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = request(url, method, body)
    elapsed = time.perf_counter() - started
    if answer.status >= 300:
        raise RuntimeError(f"{method} {url.split('/l/')[0]}… answered {answer.status}: {answer.body}")
    return elapsed, answer.body


def cycles(base: str, pool: str, count: int) -> tuple[list[float], list[float]]:
    borrows, returns = [], []
    for _ in range(count):
        took, held = timed(f"{base}/l/{pool}/borrow", "POST", {"ttl": 60, "wait": 10})
        borrows.append(took)
        took, _ = timed(f"{base}/l/{pool}/return", "POST", {"lease": held["lease"]})
        returns.append(took)
    return borrows, returns


def sync_run(base: str, sequential: int, clients: int, rounds: int) -> dict[str, Any]:
    pool = str(uuid.uuid4())
    timed(f"{base}/l/{pool}", "PUT", {"count": 1})
    cycles(base, pool, 10)  # warm: every function's sandbox started, connections open
    borrows, returns = cycles(base, pool, sequential)
    result: dict[str, Any] = {"sequential": {"borrow": percentiles(borrows), "return": percentiles(returns)}}

    shared = str(uuid.uuid4())
    timed(f"{base}/l/{shared}", "PUT", {"count": clients})
    got: list[tuple[list[float], list[float]]] = []
    lock = threading.Lock()

    def client() -> None:
        mine = cycles(base, shared, rounds)
        with lock:
            got.append(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    result["concurrent"] = {
        "clients": clients,
        "borrow": percentiles([x for b, _ in got for x in b]),
        "return": percentiles([x for _, r in got for x in r]),
        "cycles_per_s": round(clients * rounds / wall, 1),
    }
    return result


def async_run(
    base: str, receiver: Receiver, tickets: int, lost: list[int] | None = None, warm: int = 0
) -> list[float]:
    """Return → callback, one ticket after another on a pool of one slot, after `warm`
    tickets not counted. A holder whose return finds it holding nothing lost its slot while
    its grant stood (the pool handed it on): its index goes to `lost` and its sample is left
    out (the next ticket's grant came before the return)."""
    pool = str(uuid.uuid4())
    timed(f"{base}/l/{pool}", "PUT", {"count": 1})
    _, held = timed(f"{base}/l/{pool}/borrow", "POST", {"ttl": TICKET_TTL_S})
    holder = held["lease"]
    handoffs: list[float] = []
    for n in range(warm + tickets):
        lease, path = str(uuid.uuid4()), f"/bench/{uuid.uuid4().hex}"
        callback = {"url": receiver.url(path), "token": "bench"}
        timed(f"{base}/l/{pool}/enqueue", "POST", {"ttl": TICKET_TTL_S, "lease": lease, "callback": callback})
        time.sleep(SETTLE_S)
        returned = time.time()
        _, answer = timed(f"{base}/l/{pool}/return", "POST", {"lease": holder})
        got = receiver.wait(path, timeout=30).at - returned
        if n < warm:
            pass
        elif answer.get("returned") is False and lost is not None:
            lost.append(len(handoffs) + len(lost))
        else:
            handoffs.append(got)
        holder = lease
    timed(f"{base}/l/{pool}/return", "POST", {"lease": holder})
    return handoffs


def expiry_run(base: str, receiver: Receiver, tickets: int) -> list[float]:
    """Expiry → callback, one ticket after another on a pool of one slot whose holder lets
    its lease expire."""
    pool = str(uuid.uuid4())
    timed(f"{base}/l/{pool}", "PUT", {"count": 1})
    delays = []
    for _ in range(tickets):
        sent = time.time()
        took, _ = timed(f"{base}/l/{pool}/borrow", "POST", {"ttl": EXPIRY_TTL_S, "wait": 10})
        # The lease's start: halfway through the borrow's round trip (within a few ms).
        expires = sent + took / 2 + EXPIRY_TTL_S
        lease, path = str(uuid.uuid4()), f"/bench/{uuid.uuid4().hex}"
        callback = {"url": receiver.url(path), "token": "bench"}
        timed(f"{base}/l/{pool}/enqueue", "POST", {"ttl": 1, "lease": lease, "callback": callback})
        delays.append(receiver.wait(path, timeout=EXPIRY_TTL_S + 30).at - expires)
        # The ticket's own lease (1 s) ends before the next borrow finds the slot free.
        timed(f"{base}/l/{pool}/return", "POST", {"lease": lease})
    return delays


def admin_get(admin: str, path: str) -> Any:
    return request(admin + path).body


def costs(admin: str) -> dict[str, float]:
    stats = admin_get(admin, "/stats")
    queue = next(s for s in stats["sources"] if s["kind"] == "QueueSource")
    stream = next(s for s in stats["sources"] if s["kind"] == "StreamSource")
    calls = admin_get(admin, "/calls")["calls"]
    sent = sum(1 for c in calls if c["action"] == "sqs:SendMessage")
    by_routes = sum(
        1 for c in calls if c["action"] == "sqs:SendMessage" and c["function"] != "DispatcherFunction"
    )
    counted: dict[str, float] = {
        "dispatcher_invocations": stats["functions"]["DispatcherFunction"]["invocations"],
        "stream_batches": stream["batches_invoked"],
        "wake_batches": queue["batches_invoked"],
        "wakes_sent": sent,
        "wakes_sent_by_routes": by_routes,
        "wakes_received": queue["messages_received"],
    }
    for who in ("dispatcher", "routes"):
        for c in calls:
            if c["service"] != "dynamodb" or (c["function"] == "DispatcherFunction") != (who == "dispatcher"):
                continue
            name = f"{who}_{c['action'].split(':')[1]}"
            counted[name] = counted.get(name, 0) + 1
            # What DynamoDB bills (the IAM proxy's count: failed conditional writes at
            # their item's size).
            for unit in ("wcu", "rcu"):
                counted[f"{who}_{unit}"] = counted.get(f"{who}_{unit}", 0) + c.get(unit, 0)
            counted[f"{who}_unsized"] = counted.get(f"{who}_unsized", 0) + int(c.get("unsized", False))
    return counted


def release_build() -> list[str]:
    """Builds the functions and the burst client as deployed (release); the stack's
    options that run them."""
    subprocess.run(["cargo", "build", "-q", "--release", "--workspace", "--bins"], check=True, cwd=ROOT)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return ["--bin-dir", str(target / "release")]


def burst(front: str, admin: str, tickets: int, release: bool) -> dict[str, Any]:
    """tests/bench's burst against the stack: its table of figures, and what one ticket
    cost the stack."""
    before = costs(admin)
    profile = ["--release"] if release else []
    command = ["cargo", "run", "-q", *profile, "-p", "bench", "--bin", "burst", "--"]
    args = [*command, "--api", front, "--tickets", str(tickets)]
    run = subprocess.run(args, check=False, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"burst failed: {run.stderr.strip()[-2000:]}")
    time.sleep(2)  # the last invocations' stream records
    after = costs(admin)
    return {
        "table": run.stdout.strip().splitlines(),
        "per_ticket": {k: round((after[k] - before.get(k, 0)) / tickets, 2) for k in after},
    }


@contextmanager
def local_api(dynamodb: str) -> Iterator[str]:
    port = launch.free_port()
    table = f"aws-local-bench-{uuid.uuid4().hex[:8]}"
    binary = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "local-api"
    args = [str(binary), "--port", str(port), "--dynamodb", dynamodb, "--table", table]
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1", **os.environ}
    process = subprocess.Popen([*args, "--allow-local-callbacks"], stdout=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: request(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status == 200, 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def wait_until(probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("not ready in time")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="tests/aws-local --bench")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--tickets", type=int, default=30)
    parser.add_argument("--expiries", type=int, default=10)
    parser.add_argument("--stream-delays", default="200,0", help="the stack's --stream-delay-ms, each")
    parser.add_argument("--async-only", action="store_true", help="no borrow, return, local-api")
    parser.add_argument("--burst", type=int, default=0, help="tickets in the async burst (0: none)")
    parser.add_argument("--release", action="store_true", help="the burst on release builds, as deployed")
    args = parser.parse_args()
    release = release_build() if args.release else []
    delays = [int(d) for d in args.stream_delays.split(",")]
    receiver = Receiver()
    figures: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args)}
    for n, delay in enumerate(delays):
        if args.async_only and not args.tickets and not args.expiries:
            break  # the burst alone
        with launch.running(OUT / "bench", "--stream-delay-ms", str(delay)) as (front, admin):
            if n == 0 and not args.async_only:
                figures["aws-local"] = sync_run(front, args.cycles, args.clients, args.rounds)
                dynamodb = admin_get(admin, "/stack")["dynamodb"]
                with local_api(dynamodb) as base:
                    figures["local-api"] = sync_run(base, args.cycles, args.clients, args.rounds)
                    figures["local-api"]["callback"] = percentiles(async_run(base, receiver, args.tickets))
            warm = async_run(front, receiver, WARM_TICKETS)
            before = costs(admin)
            lost: list[int] = []
            handoffs = async_run(front, receiver, args.tickets, lost)
            # Every wake sent arrives within TICKET_TTL_S (and a second), and costs a step.
            deadline = time.monotonic() + TICKET_TTL_S + 10
            while (after := costs(admin))["wakes_received"] < after["wakes_sent"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(1)  # the last invocations' stream records
            after = costs(admin)
            spent = {k: after[k] - before.get(k, 0) for k in after}
            figures.setdefault("aws-local", {})[f"callback_stream_delay_{delay}ms"] = {
                **percentiles(handoffs),
                "samples_ms": [round(x * 1000, 1) for x in handoffs],
                "warm_up_ms": [round(x * 1000, 1) for x in warm],
                "slots_lost_while_granted": lost,
                "per_ticket": {k: round(v / args.tickets, 2) for k, v in spent.items()},
            }
            if args.expiries:
                expiries = expiry_run(front, receiver, args.expiries)
                figures["aws-local"][f"expiry_stream_delay_{delay}ms"] = {
                    **percentiles(expiries),
                    "samples_ms": [round(x * 1000, 1) for x in expiries],
                }
    receiver.close()
    if args.burst:
        with launch.running(OUT / "bench", "--stream-delay-ms", str(delays[0]), *release) as (front, admin):
            figures.setdefault("aws-local", {})[f"burst_stream_delay_{delays[0]}ms"] = burst(
                front, admin, args.burst, args.release
            )
    text = json.dumps(figures, indent=2)
    (OUT / "bench.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
