"""Where a hop's time goes: py-spy on the worker replica (a `hookbus worker` subprocess),
py-spy on the orchestrator side (this process), under a steady hop load.

    python -m tests.bench.profile_hop [--kind on_chunk|before_llm_call] [--concurrency 32]
        [--seconds 8] [--cprofile]

Both sides are sampled with py-spy (`--idle`, so idle time shows as epoll wait); prints,
for each side, the share of samples under each part of the hop path (inclusive), own
time by library and the top functions; writes the raw collapsed stacks to --out
(default /tmp/hookbus-profile). `--cprofile` adds a cProfile of this process (it slows
the orchestrator side down, so rates drop). Not part of `python -m tests.bench` (py-spy
needs ptrace).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.bench import payloads
from tests.bench.common import bench_redis, new_prefix, processes, quiet_logs
from tests.bench.hop import GROUP, noop_group

# Inclusive: share of samples with a frame of this part anywhere in the stack.
# Frames look like "function (path/file.py:line)"; line numbers are stripped first.
WORKER_PARTS = [
    ("FastStream dispatch (subscriber loop -> handler)", ["SubscriberUsecase.process_message (faststream"]),
    ("fast_depends Context injection in a thread", ["run_in_threadpool (fast_depends"]),
    ("hookbus WorkerReplica.process", ["WorkerReplica.process (hookbus/services/worker/replica.py)"]),
    ("  decode HopEvent", ["decode (hookbus/bus/wire/envelopes.py)"]),
    ("  GroupHost.answer", ["GroupHost.answer (hookbus/services/worker/host.py)"]),
    ("    run_hooks", ["run_hooks (hookbus/skills/runner.py)"]),
    ("  encode HopReply", ["encode (hookbus/bus/wire/envelopes.py)"]),
    ("  reply + ack pipeline", ["Pipeline.execute (redis", "ReplyBatcher._flush"]),
    ("EventWriter (emit + flush)", ["(hookbus/bus/store/events.py)"]),
    ("registry heartbeat / claim / lease loops", ["_heartbeat_loop", "_claim_loop", "_lease_loop"]),
]

ORCHESTRATOR_PARTS = [
    ("BusRuntime.hop (all)", ["BusRuntime.hop (hookbus/services/orchestrator/serving/bus_runtime.py)"]),
    ("  HookData/Context model_dump", ["BaseModel.model_dump (pydantic"]),
    ("  HopEvent build + encode", ["encode (hookbus/bus/wire/envelopes.py)", "encode_hop (tests/bench", "BaseModel.__init__ (pydantic"]),
    ("  XADD of the hop (redis-py)", ["execute_command (redis/asyncio/client.py)"]),
    ("  apply reply (HookData validate)", ["BusRuntime._apply (", "model_validate_json (pydantic"]),
    ("reply reader task (XREAD + decode)", ["ReplyRouter._read_replies (", "FastRouter._read_replies ("]),
    ("  decode HopReply", ["decode (hookbus/bus/wire/envelopes.py)"]),
    ("record_stage + EventWriter", ["record_stage (", "(hookbus/bus/store/events.py)"]),
    ("registry poll", ["RegistryView"]),
    ("bench driver loop", ["loop (tests/bench/profile_hop.py)"]),
]

# Exclusive: each sample goes to the first category its stack matches, leaf first.
SELF_CATEGORIES = [
    ("idle (epoll wait)", ["select (selectors.py)", "EpollSelector.select"]),
    ("thread hand-off (threading/queue)", ["threading.py", "queue.py", "concurrent/futures"]),
    ("pydantic", ["pydantic"]),
    ("hiredis / redis-py", ["redis/", "hiredis"]),
    ("fast_depends", ["fast_depends/"]),
    ("faststream", ["faststream/"]),
    ("anyio", ["anyio/"]),
    ("copy.deepcopy", ["(copy.py)"]),
    ("json (stdlib)", ["json/"]),
    ("logging / structlog", ["logging/", "structlog/"]),
    ("hookbus code", ["bus/", "services/", "skills/", "tests/bench/"]),
    ("asyncio + sockets", ["asyncio/", "socket"]),
]


def _frames(stack: str) -> list[str]:
    return [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]


def summarize_collapsed(path: Path, parts: list[tuple[str, list[str]]] = WORKER_PARTS, top: int = 20) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    category: collections.Counter[str] = collections.Counter()
    total = 0
    other_threads = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = _frames(stack)
        if frames[0].startswith("Thread._bootstrap") or frames[0].startswith("_bootstrap ("):
            # another thread (anyio's thread pool in a FastStream worker): busy samples only
            if not frames[-1].startswith(("Condition.wait", "Event.wait")):
                other_threads += count
            continue
        total += count
        own[frames[-1]] += count
        for label, needles in parts:
            if any(any(n in frame for n in needles) for frame in frames):
                inclusive[label] += count
        for frame in reversed(frames):
            hit = next((label for label, needles in SELF_CATEGORIES if any(n in frame for n in needles)), None)
            if hit:
                category[hit] += count
                break
        else:
            category["other"] += count
    share = lambda n: n / max(total, 1) * 100  # noqa: E731
    out = [f"main-thread samples: {total} (idle included); other threads, busy samples: {other_threads}"]
    out.append("inclusive share, by part of the hop path:")
    out += [f"  {share(inclusive[label]):5.1f}%  {label}" for label, _ in parts]
    out.append("own time, by library (leaf-first):")
    out += [f"  {share(n):5.1f}%  {label}" for label, n in category.most_common()]
    out.append("top functions by own time:")
    out += [f"  {share(n):5.1f}%  {frame[:140]}" for frame, n in own.most_common(top)]
    return "\n".join(out)


async def profile(
    kind: str, concurrency: int, seconds: float, out: Path, use_cprofile: bool
) -> None:
    quiet_logs()
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    with bench_redis() as redis_url:
        prefix = new_prefix("prof")
        async with processes() as procs:
            side, plan, child = await noop_group(procs, redis_url, prefix)
            runtime = side.runtime
            segment = plan.segments(kind, ["chat"])[0]
            data = payloads.KINDS[kind]()
            stop = time.perf_counter() + seconds + 1.0
            count = 0

            async def loop() -> None:
                nonlocal count
                ctx = payloads.context()
                while time.perf_counter() < stop:
                    began = time.perf_counter()
                    result = await runtime.hop(segment, data, ctx, kind)
                    runtime.record_stage(ctx.completion_id, kind, GROUP, result.outcomes, (time.perf_counter() - began) * 1000)
                    count += 1

            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            raw = out / f"worker-{kind}-c{concurrency}.txt"
            raw_orch = out / f"orchestrator-{kind}-c{concurrency}.txt"
            recorders = [
                subprocess.Popen(  # noqa: ASYNC220
                    [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "500",
                     "--format", "raw", "--output", str(path), "--nonblocking", "--idle"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                for pid, path in ((child.pid, raw), (os.getpid(), raw_orch))
            ]
            profiler = cProfile.Profile() if use_cprofile else None
            began = time.perf_counter()
            if profiler:
                profiler.enable()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            if profiler:
                profiler.disable()
            wall = time.perf_counter() - began
            for recorder in recorders:
                await asyncio.to_thread(recorder.wait)
            await side.close()
    print(f"\n### {kind} c={concurrency}: "
          f"{count} hops in {wall:.1f}s = {count / wall:.0f} hops/s")
    for title, path, parts in (("worker", raw, WORKER_PARTS), ("orchestrator", raw_orch, ORCHESTRATOR_PARTS)):
        print(f"\n-- {title} side (py-spy --idle, main thread, wall-clock samples):")
        if path.exists():
            print(summarize_collapsed(path, parts))
        else:
            print("  (py-spy wrote nothing: is ptrace allowed?)")
    if profiler:
        stats_path = out / f"orchestrator-{kind}-c{concurrency}.pstats"
        profiler.dump_stats(stats_path)
        print("\n-- orchestrator side (cProfile, cumulative):")
        stats = pstats.Stats(str(stats_path))
        stats.sort_stats("cumulative").print_stats(35)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="on_chunk", choices=list(payloads.KINDS))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--cprofile", action="store_true", help="also cProfile this process (slows it)")
    parser.add_argument("--out", default="/tmp/hookbus-profile")
    args = parser.parse_args()
    asyncio.run(
        profile(args.kind, args.concurrency, args.seconds, Path(args.out), args.cprofile)
    )


if __name__ == "__main__":
    main()
