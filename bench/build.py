"""Build cost: 500 capabilities over 50 tools whose probes each take 200 ms.

Prints the build's wall time against the ideal: the longest single probe, timed
alone in the same round (a build that probes every tool at once, and costs
nothing else, takes exactly that). The sequential sum of probe times is printed
too, for scale. Two probe kinds are measured, in interleaved rounds: a Python
probe (asyncio.sleep) and a real subprocess (`sleep 0.2`).

    python bench/build.py [--caps 500] [--tools 50] [--probe-s 0.2] [--repeat 3]
                          [--results FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's `queue` (which aiosqlite
# imports): keep this folder off sys.path, and put the repository on it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import asyncio
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench._harness import Results, spread
from capd.registry import BuildConfig, CommandProbe, PythonProbe, ToolSpec, build


def write_pack(folder: Path, caps: int, tools: int, probe_s: float) -> None:
    (folder / "bench_pack.py").write_text(textwrap.dedent(f'''
        import asyncio
        from pydantic import BaseModel
        from capd.registry import op

        class P(BaseModel):
            x: int = 0

        @op("bench.noop")
        async def noop(params: P) -> int:
            return params.x

        async def slow_probe() -> bool:
            await asyncio.sleep({probe_s})
            return True
    '''))
    lines = []
    for i in range(caps):
        lines.append(textwrap.dedent(f'''
            [[capability]]
            name = "bench.cap{i}"
            op = "bench.noop"
            summary = "Benchmark capability {i}."
            requires = ["tool{i % tools}", "tool{(i * 7 + 3) % tools}"]
        '''))
    (folder / "caps.toml").write_text("".join(lines).replace('["tool0", "tool0"]', '["tool0"]'))


async def measure(config: BuildConfig) -> float:
    started = time.perf_counter()
    registry = await build(config, fresh=True)
    elapsed = time.perf_counter() - started
    snap = registry.snapshot()
    assert not snap.errors, snap.errors[:3]
    assert len(snap.live) + len(snap.disabled) == len(registry)
    return elapsed


async def longest_probe(kind: str, tools: int, probe_s: float) -> float:
    """The ideal build: the longest of ``tools`` probes, each timed alone, one after another."""
    longest = 0.0
    for _ in range(min(tools, 5)):
        started = time.perf_counter()
        if kind == "python":
            await asyncio.sleep(probe_s)
        else:
            proc = await asyncio.create_subprocess_exec("sleep", str(probe_s))
            await proc.wait()
        longest = max(longest, time.perf_counter() - started)
    return longest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--caps", type=int, default=500)
    parser.add_argument("--tools", type=int, default=50)
    parser.add_argument("--probe-s", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results = Results(args.results)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_pack(folder, args.caps, args.tools, args.probe_s)
        sys.path.insert(0, str(folder))
        kinds: dict[str, tuple[str, dict[str, ToolSpec]]] = {
            "python probe (asyncio.sleep)": ("python", {
                f"tool{i}": PythonProbe(target="bench_pack:slow_probe") for i in range(args.tools)
            }),
            "command probe (sleep subprocess)": ("command", {
                f"tool{i}": CommandProbe(argv=("sleep", str(args.probe_s)))
                for i in range(args.tools)
            }),
        }
        sequential = args.tools * args.probe_s
        print(f"build of {args.caps} capabilities over {args.tools} tools, "
              f"each probe {args.probe_s * 1000:.0f} ms; {args.repeat} interleaved rounds")
        print(f"ideal: the longest single probe, timed alone each round "
              f"(the sequential sum would be {sequential:.2f} s)")
        builds: dict[str, list[float]] = {}
        ideals: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for label, (kind, tools) in kinds.items():
                config = BuildConfig(plugins=("bench_pack",),
                                     declarations=(folder / "caps.toml",),
                                     tools=tools, entry_points=False)
                ideals.setdefault(label, []).append(
                    asyncio.run(longest_probe(kind, args.tools, args.probe_s)))
                builds.setdefault(label, []).append(asyncio.run(measure(config)))
        for label in kinds:
            median, lo, hi = spread(builds[label])
            ideal = spread(ideals[label])[0]
            print(f"  {label:<34} median {median:.3f} s ({lo:.3f}-{hi:.3f})  ideal "
                  f"{ideal:.3f} s  ratio to ideal {median / ideal:.2f} "
                  f"(+{(median - ideal) * 1e3:.0f} ms); sequential / build "
                  f"{sequential / median:.1f}x")
            results.add("build", f"{args.caps} caps / {args.tools} tools, {label}",
                        builds[label], "s", against="longest single probe (ideal)",
                        against_values=ideals[label],
                        note=f"sequential sum {sequential:.1f} s")


if __name__ == "__main__":
    main()
