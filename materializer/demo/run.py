"""``materializer demo``: the whole product on a sample stream, on one machine, in one command.

Ctrl-C and SIGTERM only set a flag. Startup checks it between steps and the
view checks it twice a second, and then everything that was started is
stopped in reverse order by the stack — the same path a failure takes — so
the demo leaves no process behind however it ends (short of SIGKILL).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from rich.console import Console
from rich.live import Live

from materializer.config import config_problems, load_config
from materializer.demo.display import Header, client_snippet, plain_lines, render
from materializer.demo.domain import ORDERS, USER_EVENTS, demo_config, write_config
from materializer.demo.events import DemoEvent, EventGenerator, iso_time
from materializer.demo.monitor import Monitor, Snapshot
from materializer.demo.producer import DeliveryLog, EventProducer
from materializer.demo.stack import HOST, ChildExited, DemoStack, choose_port
from materializer.demo.steps import Interrupted, Steps
from materializer.demo.workdir import WorkDir, open_workdir
from materializer.errors import ConfigError, MaterializerError
from materializer.testing.process import ManagedProcess

REFRESH_SECONDS = 0.5
PLAIN_EVERY_SECONDS = 5.0


@dataclass(frozen=True)
class DemoOptions:
    """The demo's few knobs; the defaults make a run worth watching on a laptop."""

    duration: float = 0.0
    """Seconds of producing; 0 produces until stopped."""
    rate: float = 200.0
    """Events per second over both topics."""
    seed: int = 1
    port: int = 50051
    """The query service's port, or a free one when it is taken."""
    redis_url: str | None = None
    """An existing Redis (its demo maps are cleared) instead of a redis-server of our own."""
    workdir: Path | None = None
    """Keep config, logs and tables here; by default a temp dir removed at exit."""
    exit_after_duration: bool = False
    """With ``duration``: exit once the maps have folded every event, instead of serving on."""
    schema_registry: bool = False
    """Start a schema registry and produce Avro through it instead of JSON."""


@dataclass
class _Run:
    """What the view needs of the running demo."""

    options: DemoOptions
    steps: Steps
    header: Header
    producer: EventProducer
    pipeline: ManagedProcess
    query: ManagedProcess
    redis_url: str


def run_demo(options: DemoOptions, console: Console | None = None) -> int:
    """Start everything, show progress until stopped, stop everything; the exit code.

    0 after Ctrl-C or SIGTERM (also during startup) and after
    ``exit_after_duration``; 1 when a service fails to start or a child dies;
    2 when the work dir cannot be used.
    """
    console = console or Console(highlight=False)
    stop = threading.Event()
    # A closed terminal (SIGHUP) stops the demo as Ctrl-C does, children included.
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set())
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        return _run(options, Steps(console, stop))
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _run(options: DemoOptions, steps: Steps) -> int:
    try:
        workdir = open_workdir(options.workdir)
    except MaterializerError as exc:
        steps.say(str(exc), "red")
        return 2
    try:
        steps.say(f"work dir {workdir.path}" + (" (removed at exit)" if workdir.temporary else ""))
        with DemoStack(workdir, steps) as stack:
            try:
                return _start_and_show(options, steps, stack, workdir)
            except Interrupted:
                steps.say("stopping")
                return 0
            except (MaterializerError, KafkaException) as exc:
                steps.say(str(exc), "red")
                steps.say("stopping")
                return 1
    finally:
        workdir.close()
        if workdir.temporary:
            steps.say(f"removed work dir {workdir.path}")
        else:
            steps.say(f"kept work dir {workdir.path}: config, logs and Delta tables")


def _start_and_show(options: DemoOptions, steps: Steps, stack: DemoStack, workdir: WorkDir) -> int:
    bootstrap = stack.kafka()
    redis_url = stack.redis(options.redis_url)
    stack.topics(bootstrap)
    avro = stack.registry() if options.schema_registry else None
    port = choose_port(options.port)
    if port != options.port:
        steps.say(f"port {options.port} is taken: the query service uses port {port}", "yellow")
    with steps.step(f"writing {workdir.config.name}"):
        doc = demo_config(
            workdir=workdir.path,
            bootstrap_servers=bootstrap,
            redis_url=redis_url,
            port=port,
            registry_url=None if avro is None else avro.registry_url,
        )
        write_config(workdir.config, doc)
        problems = config_problems(load_config(workdir.config))
        if problems:
            raise ConfigError(str(workdir.config), problems)
    pipeline = stack.pipeline(workdir.config)
    query = stack.query_service(workdir.config, port)
    address = f"{HOST}:{port}"
    steps.say(f"query service listening on {address}", "bold")

    start_us = int(time.time() * 1000) * 1000
    events = EventGenerator(options.seed, start_us, options.rate)
    producer = stack.producer(
        EventProducer(
            bootstrap,
            events,
            rate=options.rate,
            duration=options.duration,
            log=DeliveryLog(),
            encode=DemoEvent.encoded if avro is None else avro,
        )
    )
    how_long = f"for {options.duration:g} s" if options.duration else "until Ctrl-C"
    steps.say(
        f"producing {options.rate:g} events/s as {'JSON' if avro is None else 'Avro'} to "
        f"{USER_EVENTS} and {ORDERS} {how_long} "
        f"(seed {options.seed}, event times from {iso_time(start_us)})"
    )
    header = Header(address, str(workdir.config), options.seed, options.rate)
    run = _Run(options, steps, header, producer, pipeline, query, redis_url)
    return asyncio.run(_show(run))


def _producer_state(run: _Run) -> str:
    producer = run.producer
    if producer.finished.is_set():
        return f"produced {producer.sent:,} events"
    elapsed = time.monotonic() - producer.started_at
    if run.options.duration:
        return f"producing for {run.options.duration:g} s ({elapsed:.0f} s in)"
    return f"producing until Ctrl-C ({elapsed:.0f} s in)"


def _finished_line(run: _Run) -> str:
    producer = run.producer
    log = producer.log
    seconds = producer.finished_at - producer.started_at
    failed = f", {log.failed:,} failed: {log.last_error}" if log.failed else ""
    then = (
        "exiting once the maps have folded them"
        if run.options.exit_after_duration
        else "serving until Ctrl-C"
    )
    return (
        f"produced {producer.sent:,} events in {seconds:.1f} s ({USER_EVENTS} "
        f"{log.count(USER_EVENTS):,}, {ORDERS} {log.count(ORDERS):,}{failed}); {then}"
    )


def _caught_up(snapshot: Snapshot) -> bool:
    return bool(snapshot.maps) and all(m.lag == 0 and m.folded == m.produced for m in snapshot.maps)


async def _show(run: _Run) -> int:
    """The view until a stop is asked (or, with ``exit_after_duration``, everything is folded)."""
    console = run.steps.console
    monitor = Monitor(run.redis_url, run.header.address, run.producer.log)
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    try:
        if live is not None:
            live.start()
        farewell = await _watch(run, monitor, live)
    finally:
        if live is not None:
            live.stop()  # before anything else prints: the last view stays on screen above it
        await monitor.close()
    run.steps.say(farewell)
    return 0


async def _watch(run: _Run, monitor: Monitor, live: Live | None) -> str:
    """Refresh the view until it is time to stop; what to say then."""
    steps = run.steps
    started = time.monotonic()
    last_plain = 0.0
    announced = False
    snippet_shown = False
    while not steps.stop.is_set():
        for what, proc in (("the pipeline", run.pipeline), ("the query service", run.query)):
            if not proc.alive():
                raise ChildExited(what, proc)
        snapshot = await monitor.snapshot()
        if run.producer.finished.is_set() and not announced:
            steps.say(_finished_line(run))
            announced = True
        now = time.monotonic()
        if live is not None:
            live.update(render(snapshot, run.header, _producer_state(run)), refresh=True)
        elif now - last_plain >= PLAIN_EVERY_SECONDS:
            for line in plain_lines(snapshot, now - started):
                steps.say(line)
            if not snippet_shown and snapshot.lookups.get_key:
                snippet = client_snippet(run.header.address, snapshot.lookups.get_key)
                steps.say(f"query it yourself:\n{snippet}")
                snippet_shown = True
            last_plain = now
        if run.options.exit_after_duration and announced and _caught_up(snapshot):
            if live is None:
                for line in plain_lines(snapshot, now - started):
                    steps.say(line)
            return "every event is folded: stopping"
        await asyncio.sleep(REFRESH_SECONDS)
    return "stopping"
