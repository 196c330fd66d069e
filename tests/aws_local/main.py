"""tests/aws-local: the deployed shape of template.yaml, run whole on this machine.

    tests/aws-local --port PORT [--admin-port PORT] [--allow-local-callbacks]
                    [--bin-dir DIR] [--stream-delay-ms MS] [--max-concurrency N]
                    [--parameter-overrides NAME=VALUE ...]

Starts, in the foreground: DynamoDB Local (unless DYNAMODB_ENDPOINT names one), moto's SQS,
the table and queues as template.yaml declares them, every function's binary under the
Runtime API emulator behind its IAM proxy, the stream and queue event sources, the front
door on PORT and the admin endpoint. Prints `ready: http://127.0.0.1:PORT/` and
`admin: http://127.0.0.1:N/` on stdout once they answer; stops everything it started on
SIGINT or SIGTERM. docs/OPERATIONS.md has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import string
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from . import awsjson, calls, procs, queues, sigv4, table, template
from .admin import Admin
from .faults import Faults
from .front import FrontDoor
from .iam import Proxy, Recorder
from .model import JsonObject
from .runtime import FunctionPool, Runtime, environment
from .sqs import QueueSource
from .stream import StreamSource

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("aws-local")

Cleanup = Callable[[], Awaitable[None]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tests/aws-local", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the front door's port (0: a free one)")
    parser.add_argument(
        "--admin-port", type=int, default=0, help="the admin endpoint's port (default: a free one)"
    )
    parser.add_argument(
        "--allow-local-callbacks",
        action="store_true",
        help="set ALLOW_LOCAL_CALLBACKS=true in every function (http and loopback callbacks)",
    )
    parser.add_argument(
        "--bin-dir", type=Path, help="take the function binaries from DIR instead of building them"
    )
    parser.add_argument("--template", type=Path, default=ROOT / "template.yaml")
    parser.add_argument("--run-dir", type=Path, help="logs and state (default: target/aws-local/run-PORT)")
    parser.add_argument("--stack-name", default="aws-local")
    parser.add_argument(
        "--stream-delay-ms", type=int, default=200, help="stream to function delay (AWS's published median)"
    )
    parser.add_argument("--max-concurrency", type=int, default=16, help="sandboxes per function at most")
    parser.add_argument(
        "--parameter-overrides",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="template parameters, as sam deploy takes them (e.g. BorrowConcurrency=8 WaitingBudget=4)",
    )
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


# ---- the parts that run beside the harness --------------------------------------------------
async def build(names: set[str]) -> dict[str, Path]:
    """`cargo build --workspace --bins --tests`: the binaries with the same feature
    unification as `cargo test --workspace` (without --tests, dev-dependencies' features
    drop out and the AWS SDK is compiled a second time), so each build reuses the other's."""
    log.info("cargo build --workspace --bins --tests")
    process = await procs.start(
        ["cargo", "build", "--workspace", "--bins", "--tests", "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        log=sys.stderr,
        stdout_pipe=True,
    )
    found: dict[str, Path] = {}
    try:
        assert process.stdout is not None
        async for line in process.stdout:
            message = json.loads(line)
            if message.get("reason") != "compiler-artifact":
                continue
            target = message["target"]
            if target["kind"] == ["bin"] and not message["profile"]["test"] and target["name"] in names:
                found[target["name"]] = Path(message["executable"])
        code = await process.wait()
    except asyncio.CancelledError:
        await procs.stop(process)
        raise
    if code != 0:
        raise RuntimeError(f"cargo build failed (exit status {code})")
    missing = names - set(found)
    if missing:
        raise RuntimeError(f"cargo built no binary for {sorted(missing)}")
    return found


async def start_dynamodb(cleanups: list[Cleanup]) -> str:
    if os.environ.get("DYNAMODB_ENDPOINT"):
        return os.environ["DYNAMODB_ENDPOINT"]
    script = str(ROOT / "tests" / "dynamodb-local")
    process = await procs.start([script, "start"], log=sys.stderr, stdout_pipe=True)
    try:
        out, _ = await process.communicate()
    except asyncio.CancelledError:
        # Stopped while it waits for Java: the script and its java are one process group.
        await procs.stop(process)
        raise
    values = dict(line.split("=", 1) for line in out.decode().split() if "=" in line)
    if process.returncode != 0 or "DYNAMODB_ENDPOINT" not in values:
        raise RuntimeError("tests/dynamodb-local start failed")
    pid = values["DYNAMODB_PID"]

    async def stop() -> None:
        stopper = await procs.start([script, "stop", pid], log=sys.stderr)
        await stopper.wait()

    cleanups.append(stop)
    return values["DYNAMODB_ENDPOINT"]


async def start_moto(cleanups: list[Cleanup], log_file: Path) -> str:
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    # moto's default account is 123456789012; the harness's ARNs use 000000000000.
    env = dict(os.environ, MOTO_ACCOUNT_ID=awsjson.ACCOUNT)
    process = await procs.start([str(server), "-H", "127.0.0.1", "-p", str(port)], env=env, log=log_file)

    async def stop() -> None:
        await procs.stop(process)

    cleanups.append(stop)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"moto_server exited; see {log_file}")
            try:
                await awsjson.call(session, endpoint, "sqs", "ListQueues", {})
                return endpoint
            except (aiohttp.ClientError, awsjson.AwsError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer within 30 s; see {log_file}") from None
                await asyncio.sleep(0.1)


async def serve(app: web.Application, port: int, cleanups: list[Cleanup]) -> int:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    cleanups.append(runner.cleanup)
    bound: int = runner.addresses[0][1]
    return bound


# ---- the stack ---------------------------------------------------------------------------------
async def create_resources(
    tpl: template.Template,
    physical: template.Physical,
    session: aiohttp.ClientSession,
    dynamodb: str,
    sqs: str,
    suffix: str,
) -> dict[str, JsonObject]:
    """The tables and queues; fills `physical` with their names, URLs and ARNs, and those
    of the functions. Returns each table's DescribeTable."""
    described: dict[str, JsonObject] = {}
    for rid in tpl.of_type("AWS::DynamoDB::Table"):
        props = tpl.resolve(tpl.properties(rid), physical)
        name = props.get("TableName") or f"{physical.stack_name}-{rid}-{suffix}"
        got = await table.create(session, dynamodb, name, props)
        described[rid] = got
        physical.refs[rid] = name
        physical.attrs[(rid, "Arn")] = calls.table_arn(name)
        if "LatestStreamArn" in got:
            physical.attrs[(rid, "StreamArn")] = got["LatestStreamArn"]

    def created(rid: str, url: str, arn: str) -> None:
        physical.refs[rid] = url
        physical.attrs[(rid, "Arn")] = arn
        physical.attrs[(rid, "QueueName")] = arn.rsplit(":", 1)[-1]
        physical.attrs[(rid, "QueueUrl")] = url

    await queues.create_all(
        session,
        sqs,
        {rid: tpl.properties(rid) for rid in tpl.of_type("AWS::SQS::Queue")},
        lambda rid: f"{physical.stack_name}-{rid}-{suffix}",
        lambda props: tpl.resolve(props, physical),
        created,
    )
    for rid in tpl.of_type("AWS::Lambda::Function"):
        name = f"{physical.stack_name}-{rid}-{suffix}"
        physical.refs[rid] = name
        physical.attrs[(rid, "Arn")] = f"arn:aws:lambda:{awsjson.REGION}:{awsjson.ACCOUNT}:function:{name}"
    return described


def key_names(described: dict[str, JsonObject]) -> calls.KeyNames:
    def hash_key(schema: list[JsonObject]) -> str:
        return next(str(k["AttributeName"]) for k in schema if k["KeyType"] == "HASH")

    tables, indexes = {}, {}
    for desc in described.values():
        name = desc["TableName"]
        tables[name] = hash_key(desc["KeySchema"])
        for index in desc.get("LocalSecondaryIndexes", []) + desc.get("GlobalSecondaryIndexes", []):
            indexes[(name, index["IndexName"])] = hash_key(index["KeySchema"])
    return calls.KeyNames(tables, indexes)


def queue_depths(
    session: aiohttp.ClientSession, sqs: str, urls: dict[str, str]
) -> Callable[[], Awaitable[JsonObject]]:
    async def depths() -> JsonObject:
        found: JsonObject = {}
        for rid, url in urls.items():
            got = await awsjson.call(
                session,
                sqs,
                "sqs",
                "GetQueueAttributes",
                {
                    "QueueUrl": url,
                    "AttributeNames": [
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed",
                    ],
                },
            )
            found[rid] = {k: int(v) for k, v in got.get("Attributes", {}).items()}
        return found

    return depths


def setup_logging(run_dir: Path) -> logging.Logger:
    formatter = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    root = logging.getLogger("aws-local")
    root.setLevel(logging.INFO)
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel(logging.WARNING)
    to_stderr.setFormatter(formatter)
    to_file = logging.FileHandler(run_dir / "aws-local.log", mode="w")
    to_file.setFormatter(formatter)
    root.addHandler(to_stderr)
    root.addHandler(to_file)
    access = logging.getLogger("aws-local.access")
    access.propagate = False
    access.setLevel(logging.INFO)
    access_file = logging.FileHandler(run_dir / "access.log", mode="w")
    access_file.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(access_file)
    return access


def say(line: str) -> None:
    print(f"aws-local: {line}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace, cleanups: list[Cleanup]) -> None:
    started = time.monotonic()
    port = args.port or free_port()
    run_dir = (args.run_dir or target_dir() / "aws-local" / f"run-{port}").resolve()
    shutil.rmtree(run_dir / "logs", ignore_errors=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    access = setup_logging(run_dir)
    say(f"run directory {run_dir}")

    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    cleanups.append(session.close)

    # Side by side: the build, DynamoDB Local, moto and the template (its transform is CPU).
    tpl_task = asyncio.create_task(
        asyncio.to_thread(template.load, args.template, target_dir() / "aws-local")
    )
    dynamodb_task = asyncio.create_task(start_dynamodb(cleanups))
    moto_task = asyncio.create_task(start_moto(cleanups, run_dir / "logs" / "moto.log"))
    tpl = await tpl_task
    tpl.override(dict(pair.split("=", 1) for pair in args.parameter_overrides))
    log.info("template read in %.1f s", time.monotonic() - started)
    binaries_wanted = {
        tpl.original["Resources"][rid]["Metadata"]["BuildProperties"]["Binary"]
        for rid in tpl.of_type("AWS::Lambda::Function")
    }
    if args.bin_dir:
        binaries = {name: (args.bin_dir / name).resolve() for name in binaries_wanted}
    else:
        binaries = await build(binaries_wanted)
    for name, path in binaries.items():
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"no executable {name} at {path}")
    built_at = time.monotonic()
    dynamodb, sqs = await dynamodb_task, await moto_task
    log.info("DynamoDB Local and moto up %.1f s after the start", time.monotonic() - started)

    suffix = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(12))
    physical = template.Physical(stack_name=args.stack_name)
    described = await create_resources(tpl, physical, session, dynamodb, sqs, suffix)
    if os.environ.get("DYNAMODB_ENDPOINT"):
        # A shared DynamoDB Local outlives this run: leave no table behind.
        for desc in described.values():
            name = desc["TableName"]

            async def drop(name: str = name) -> None:
                with contextlib.suppress(Exception):
                    # The template protects its table from deletion: turned off first, as
                    # an operator would.
                    await awsjson.call(
                        session,
                        dynamodb,
                        "dynamodb",
                        "UpdateTable",
                        {"TableName": name, "DeletionProtectionEnabled": False},
                    )
                    await awsjson.call(session, dynamodb, "dynamodb", "DeleteTable", {"TableName": name})

            cleanups.append(drop)
    functions = tpl.functions(physical)
    routes = tpl.routes()
    if any(r.authorization == "AWS_IAM" for r in routes):
        say(
            "IAM authorization on "
            + ", ".join(r.key for r in routes if r.authorization == "AWS_IAM")
            + f": sign with ADMIN_ACCESS_KEY_ID={sigv4.ADMIN_ACCESS_KEY_ID}"
            + f" ADMIN_SECRET_ACCESS_KEY={sigv4.ADMIN_SECRET_ACCESS_KEY} (region {sigv4.REGION}, execute-api)"
        )

    faults, recorder = Faults(), Recorder()
    proxy = Proxy(dynamodb=dynamodb, sqs=sqs, keys=key_names(described), faults=faults, recorder=recorder)
    await proxy.start(functions)
    cleanups.append(proxy.stop)

    pools = {
        f.logical_id: FunctionPool(
            f,
            binary=binaries[f.binary],
            env=environment(
                f, proxy_url=proxy.urls[f.logical_id], allow_local_callbacks=args.allow_local_callbacks
            ),
            log_file=run_dir / "logs" / f"{f.logical_id}.log",
            max_concurrency=args.max_concurrency,
        )
        for f in functions
    }
    runtime = Runtime(pools)
    cleanups.append(runtime.stop)

    sources: list[Any] = [
        StreamSource(
            m, endpoint=dynamodb, invoke=runtime.invoke, sqs_endpoint=sqs, delay_ms=args.stream_delay_ms
        )
        for m in tpl.stream_mappings(physical)
    ] + [QueueSource(m, endpoint=sqs, invoke=runtime.invoke) for m in tpl.queue_mappings(physical)]
    tasks = [asyncio.create_task(s.run()) for s in sources]

    def stopped(task: asyncio.Task[None]) -> None:
        # A source that stops delivers nothing more, in silence but for this line.
        if not task.cancelled() and task.exception() is not None:
            log.error("an event source stopped polling", exc_info=task.exception())

    for task in tasks:
        task.add_done_callback(stopped)

    async def stop_sources() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    cleanups.append(stop_sources)

    front = FrontDoor(routes, runtime, access)
    front_port = await serve(front.app(), port, cleanups)
    queue_urls = {rid: physical.refs[rid] for rid in tpl.of_type("AWS::SQS::Queue")}
    stack: JsonObject = {
        "front": f"http://127.0.0.1:{front_port}/",
        "dynamodb": dynamodb,
        "sqs": sqs,
        "tables": {rid: d["TableName"] for rid, d in described.items()},
        "stream_arns": {rid: d.get("LatestStreamArn") for rid, d in described.items()},
        "queues": queue_urls,
        "routes": [r.key for r in routes],
        "functions": {
            f.logical_id: {
                "name": f.name,
                "binary": str(binaries[f.binary]),
                "timeout_s": f.timeout_s,
                "memory_mb": f.memory_mb,
                "proxy": proxy.urls[f.logical_id],
                "log": str(run_dir / "logs" / f"{f.logical_id}.log"),
            }
            for f in functions
        },
        "run_dir": str(run_dir),
    }
    admin = Admin(
        runtime=runtime,
        front=front,
        recorder=recorder,
        faults=faults,
        sources=sources,
        source_tasks=tasks,
        queue_depths=queue_depths(session, sqs, queue_urls),
        stack=stack,
    )
    admin_port = await serve(admin.app(), args.admin_port, cleanups)
    stack["admin"] = f"http://127.0.0.1:{admin_port}/"
    (run_dir / "stack.json").write_text(json.dumps(stack, indent=2))

    # Ready once the front door accepts a connection.
    _, writer = await asyncio.open_connection("127.0.0.1", front_port)
    writer.close()
    now = time.monotonic()
    say(
        f"up {now - built_at:.1f} s after the build ({now - started:.1f} s in all); "
        f"{len(functions)} functions, {len(routes)} routes, {len(sources)} event sources; "
        f"logs in {run_dir / 'logs'}"
    )
    print(f"ready: http://127.0.0.1:{front_port}/", flush=True)
    print(f"admin: http://127.0.0.1:{admin_port}/", flush=True)


async def amain(argv: list[str]) -> int:
    args = parse_args(argv)
    cleanups: list[Cleanup] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    startup = asyncio.create_task(run(args, cleanups))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({startup, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if startup.done():
            startup.result()
            await stopping
        else:
            startup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await startup
            status = 130
    except Exception as err:  # noqa: BLE001 - any start-up failure ends the run, cleanly
        say(f"error: {err}")
        status = 1
    finally:
        stopping.cancel()
        say("stopping")
        for cleanup in reversed(cleanups):
            try:
                await asyncio.wait_for(cleanup(), 15)
            except Exception as err:  # noqa: BLE001 - stop the rest regardless
                log.warning("cleanup failed: %s", err)
        say("stopped")
    return status


def main() -> None:
    sys.exit(asyncio.run(amain(sys.argv[1:])))


if __name__ == "__main__":
    main()
