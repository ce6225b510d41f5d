"""Speed of the ``local`` provider (issue #3): micro-batching and the converted-weights cache.

Everything goes through ``litellm.completion(model="local/smollm2-135m-instruct", ...)`` at
temperature 0 with ``ignore_eos``, so each request makes exactly ``--max-tokens`` tokens
(tok/s still counts the completion tokens litellm reports):

- single:       one request alone;
- sequential8:  eight different prompts, one after another (the baseline: no batching);
- concurrent8:  the same eight prompts from eight threads at once (micro-batched).

speedup = concurrent8 / single, the target being >= 3x; concurrent8 / sequential8 is printed
too.

plan (issue #10): the embedded trained conductor writes the plan for ``--plans`` arithmetic
test questions, one at a time, as ``conductor run`` and ``conductor serve`` do; each question
twice, interleaved: without prompt-prefix reuse (the baseline: the whole prompt computed)
and with it (the pool's system prompt kept from an earlier request, only the question
computed; ``conductor.providers._prefix_cache``). Reports median seconds per plan, the prompt tokens
reused, and whether both wrote the same plan text. Then the same questions all at once from
as many threads (one micro-batch): every prompt computed, against their shared prefix
computed once (in a cache that kept nothing before).

Cold load runs in subprocesses with a fresh ``$CONDUCTOR_HOME``: the first converts the GGUF
and writes the cache, the second reads the cache (target <= 5 s, model load only; the imports
are reported apart). The 1-minute load average is printed next to every figure: on a shared
2-core machine other work moves these numbers a lot.

Anchors measured earlier on 2 cores, fp32: 19.8 tok/s for one stream, 81.6 tok/s for 8 prompts
batched by hand, 23.4 s for the first GGUF load.

    python -m benchmarks.local_inference [--max-tokens 64] [--repeat 1] [--plans 8] [--skip-load]
                                         [--json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MODEL = "local/smollm2-135m-instruct"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how photosynthesis works.",
    "Describe the city of Paris to a tourist.",
    "What are the benefits of regular exercise?",
    "Tell me about the history of the bicycle.",
    "How does a rainbow form?",
    "Give advice to a student starting university.",
    "Describe your ideal weekend.",
]
SPEEDUP_TARGET = 3.0
CACHED_LOAD_TARGET_S = 5.0
LOAD_CHILD = """
import json, time
t0 = time.perf_counter()
from prefect_conductor.conductor.providers.local_model import SMOLLM2, LocalModelRegistry
t1 = time.perf_counter()
LocalModelRegistry.get(SMOLLM2)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
"""


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def cold_load(home: Path) -> dict[str, float]:
    """One fresh process: import time and ``LocalModelRegistry.get`` time, in seconds."""
    env = {**os.environ, "CONDUCTOR_HOME": str(home)}
    before = load1()
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"load subprocess failed:\n{proc.stderr[-2000:]}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**times, "load1": max(before, load1())}


def ask(litellm: Any, prompt: str, max_tokens: int) -> int:
    response = litellm.completion(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        ignore_eos=True,
    )
    return int(response.usage.completion_tokens)


def timed(run: Any) -> dict[str, float]:
    """tok/s of ``run()`` (which returns the tokens it made), with the load around it."""
    before = load1()
    start = time.perf_counter()
    tokens = run()
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tok_s": round(tokens / seconds, 1),
        "load1": max(before, load1()),
    }


def throughput(max_tokens: int, repeat: int) -> dict[str, Any]:
    from prefect_conductor.conductor.providers._litellm import litellm
    from prefect_conductor.conductor.providers.local_model import (
        SMOLLM2,
        LocalModelRegistry,
        model_torch_threads,
        register,
    )

    register()
    model = LocalModelRegistry.get(SMOLLM2)
    ask(litellm, "Hello", 8)  # warm-up: first-call allocations are not throughput

    generate_calls: list[int] = []  # model.generate calls per concurrent8 round

    def concurrent() -> int:
        barrier = threading.Barrier(len(PROMPTS))

        def one(prompt: str) -> int:
            barrier.wait()
            return ask(litellm, prompt, max_tokens)

        before = model.stats.groups
        with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
            tokens = sum(pool.map(one, PROMPTS))
        generate_calls.append(model.stats.groups - before)
        return tokens

    # Interleaved rounds, so a burst of other work on the machine hits every measure alike;
    # each measure reports its median round.
    rounds: dict[str, list[dict[str, float]]] = {"single": [], "sequential8": [], "concurrent8": []}
    for _ in range(repeat):
        rounds["single"].append(timed(lambda: ask(litellm, PROMPTS[0], max_tokens)))
        rounds["concurrent8"].append(timed(concurrent))
        rounds["sequential8"].append(
            timed(lambda: sum(ask(litellm, p, max_tokens) for p in PROMPTS))
        )
    return {
        **{name: median_round(samples) for name, samples in rounds.items()},
        "concurrent8_generate_calls": generate_calls,
        "largest_batch": model.stats.largest,
        "torch_threads": model_torch_threads(),  # on the model thread, where generate runs
        "repeat": repeat,
    }


def plans(count: int) -> dict[str, Any]:
    """Seconds per plan of the embedded conductor, without and with prompt-prefix reuse."""
    import statistics

    from prefect_conductor.conductor.adapters import EMBEDDED_ADAPTER
    from prefect_conductor.conductor.data.datasets import load_dataset
    from prefect_conductor.conductor.plan.prompts import conductor_messages
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.conductor.providers._prefix_cache import PrefixCache
    from prefect_conductor.conductor.providers.local_model import LocalModelRegistry

    pool = load_pool(None)
    model = LocalModelRegistry.get(EMBEDDED_ADAPTER)
    kept = model.prefix_cache if model.prefix_cache is not None else PrefixCache()
    questions = [e.question for e in load_dataset("arithmetic", split="test", limit=count + 1)]
    params = {"max_tokens": int(pool.conductor.params.get("max_tokens", 256)), "temperature": 0.0}

    def plan(question: str, reuse: bool) -> tuple[float, str, int]:
        model.prefix_cache = kept if reuse else None
        before = kept.stats.reused_tokens
        start = time.perf_counter()
        out = model.generate(conductor_messages(question, pool), **params)
        return time.perf_counter() - start, out.text, kept.stats.reused_tokens - before

    plan(questions[0], reuse=True)  # warm-up, as `conductor serve` does: keeps the prompt
    rows = []
    try:
        for question in questions[1:]:
            full_s, full_text, _ = plan(question, reuse=False)
            reuse_s, reuse_text, reused = plan(question, reuse=True)
            rows.append((full_s, reuse_s, reused, full_text == reuse_text))
    finally:
        model.prefix_cache = kept
    full = statistics.median(r[0] for r in rows)
    reused = statistics.median(r[1] for r in rows)

    def together(cache: Any) -> tuple[float, list[str]]:
        """All the questions at once from as many threads (one micro-batch)."""
        model.prefix_cache = cache
        barrier = threading.Barrier(len(questions) - 1)

        def one(question: str) -> str:
            barrier.wait()
            return model.generate(conductor_messages(question, pool), **params).text

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(questions) - 1) as threads:
            texts = list(threads.map(one, questions[1:]))
        return time.perf_counter() - start, texts

    try:  # the batch's shared prefix computed once, in a cache that kept nothing before
        batch_full_s, batch_full = together(None)
        batch_reuse_s, batch_reuse = together(PrefixCache())
    finally:
        model.prefix_cache = kept
    return {
        "plans": len(rows),
        "full_prefill_s": round(full, 2),
        "prefix_reuse_s": round(reused, 2),
        "speedup": round(full / reused, 2),
        "reused_tokens": statistics.median(r[2] for r in rows),
        "same_text": sum(r[3] for r in rows),
        "batch_full_prefill_s": round(batch_full_s, 2),
        "batch_prefix_reuse_s": round(batch_reuse_s, 2),
        "batch_speedup": round(batch_full_s / batch_reuse_s, 2),
        "batch_same_text": sum(a == b for a, b in zip(batch_full, batch_reuse, strict=True)),
        "load1": load1(),
    }


def median_round(samples: list[dict[str, float]]) -> dict[str, float]:
    ordered = sorted(samples, key=lambda s: s["tok_s"])
    return {**ordered[len(ordered) // 2], "load1": max(s["load1"] for s in samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; medians")
    ap.add_argument("--skip-load", action="store_true", help="no cold-load subprocesses")
    ap.add_argument("--plans", type=int, default=8, help="conductor plans timed (0: none)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    result: dict[str, Any] = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")
    }
    with tempfile.TemporaryDirectory(prefix="conductor-bench-") as tmp:
        if not args.skip_load:
            home = Path(tmp) / "home"
            result["cold"] = cold_load(home)  # converts the GGUF, writes the cache
            result["cached"] = cold_load(home)  # reads the cache
            os.environ["CONDUCTOR_HOME"] = str(home)  # this process loads from that cache too
        result.update(throughput(args.max_tokens, args.repeat))
        if args.plans:
            result["plan"] = plans(args.plans)

    single = result["single"]["tok_s"]
    result["single_tok_s"] = single
    result["sequential8_tok_s"] = result["sequential8"]["tok_s"]
    result["concurrent8_tok_s"] = result["concurrent8"]["tok_s"]
    result["speedup"] = round(result["concurrent8_tok_s"] / single, 2)
    result["speedup_vs_sequential8"] = round(
        result["concurrent8_tok_s"] / result["sequential8_tok_s"], 2
    )
    targets = {"speedup": result["speedup"] >= SPEEDUP_TARGET}
    if not args.skip_load:
        result["cold_load_s"] = round(result["cold"]["load_s"], 2)
        result["cached_load_s"] = round(result["cached"]["load_s"], 2)
        targets["cached_load"] = result["cached_load_s"] <= CACHED_LOAD_TARGET_S
    result["pass"] = targets

    if args.json:
        print(json.dumps(result))
        return
    print(f"{'measure':<34} {'value':>10} {'load avg 1m':>12}")
    for name in ("single", "sequential8", "concurrent8"):
        r = result[name]
        label = f"{name} tok/s ({r['tokens']} tok, {r['seconds']} s)"
        print(f"{label:<34} {r['tok_s']:>10.1f} {r['load1']:>12.2f}")
    if not args.skip_load:
        for name in ("cold", "cached"):
            r = result[name]
            print(f"{name + ' load s (model only)':<34} {r['load_s']:>10.2f} {r['load1']:>12.2f}")
            print(f"{name + ' import s':<34} {r['import_s']:>10.2f} {r['load1']:>12.2f}")
    print(
        f"concurrent8 generate calls per round {result['concurrent8_generate_calls']}; "
        f"largest batch {result['largest_batch']}; torch threads {result['torch_threads']}"
    )
    print(
        f"speedup {result['speedup']:.2f}x over single "
        f"(>= {SPEEDUP_TARGET:g}x: {'PASS' if targets['speedup'] else 'FAIL'}); "
        f"{result['speedup_vs_sequential8']:.2f}x over sequential8"
    )
    if "plan" in result:
        r = result["plan"]
        print(
            f"conductor plan, median of {r['plans']}: {r['full_prefill_s']:.2f} s with the whole "
            f"prompt computed, {r['prefix_reuse_s']:.2f} s with its prefix reused "
            f"({r['reused_tokens']:.0f} tokens; {r['speedup']:.2f}x; same plan text "
            f"{r['same_text']}/{r['plans']}; load {r['load1']:.2f})"
        )
        print(
            f"the {r['plans']} plans at once: {r['batch_full_prefill_s']:.2f} s with every prompt "
            f"computed, {r['batch_prefix_reuse_s']:.2f} s with their shared prefix computed once "
            f"({r['batch_speedup']:.2f}x; same plan text {r['batch_same_text']}/{r['plans']})"
        )
    if not args.skip_load:
        verdict = "PASS" if targets["cached_load"] else "FAIL"
        print(
            f"cached load {result['cached_load_s']:.2f} s "
            f"(<= {CACHED_LOAD_TARGET_S:g} s: {verdict})"
        )


if __name__ == "__main__":
    main()
