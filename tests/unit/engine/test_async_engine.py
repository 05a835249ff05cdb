"""AsyncLLMEngine: streaming from a background thread, abort, errors per request."""
from __future__ import annotations

import asyncio

import pytest

from llama_ref import hf_greedy, make_llama, prompts
from velocity import AsyncLLMEngine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = make_llama(path)
    engine = AsyncLLMEngine(EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=256))
    yield engine, model
    engine.shutdown()


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def test_concurrent_streams_are_incremental_and_exact(setup):
    engine, model = setup
    ps = prompts([4, 11, 23, 2], seed=21)

    async def one(i, p):
        got = []
        async for out in engine.generate(f"s{i}", p, greedy(12)):
            assert len(out.new_token_ids) == 1 and out.token_ids[-1] == out.new_token_ids[0]
            got += out.new_token_ids
        assert out.finished and out.finish_reason == "length"
        return got

    async def main():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(ps)))

    results = asyncio.run(main())
    assert results == [hf_greedy(model, p, 12) for p in ps]
    assert engine.engine.block_manager.num_used_blocks == 0


def test_leaving_early_aborts_and_frees_blocks(setup):
    engine, _ = setup
    bm = engine.engine.block_manager

    async def main():
        used_while_running = 0
        async for out in engine.generate("early", prompts([30])[0], greedy(400)):
            used_while_running = max(used_while_running, bm.num_used_blocks)
            if len(out.token_ids) == 3:
                break
        for _ in range(200):            # the engine thread applies the abort between steps
            if bm.num_used_blocks == 0 and not engine.engine.requests:
                break
            await asyncio.sleep(0.01)
        return used_while_running

    assert asyncio.run(main()) > 0
    assert bm.num_used_blocks == 0 and not engine.engine.has_unfinished()


def test_abort_from_another_thread_ends_the_stream(setup):
    engine, _ = setup

    async def main():
        reasons = []
        async for out in engine.generate("ab", prompts([5])[0], greedy(400)):
            if len(out.token_ids) == 2:
                engine.abort("ab")
            reasons.append(out.finish_reason)
        return reasons

    reasons = asyncio.run(main())
    assert reasons[-1] == "abort" and len(reasons) < 400
    assert engine.engine.block_manager.num_used_blocks == 0


def test_bad_request_raises_and_others_go_on(setup):
    engine, model = setup

    async def main():
        with pytest.raises(ValueError, match="top_p must be in"):
            SamplingParams(top_p=2.0)
        with pytest.raises(ValueError, match="prompt token ids"):
            async for _ in engine.generate("bad", [-1], greedy(3)):
                pass
        return [o async for o in engine.generate("good", [1, 2, 3], greedy(3))][-1].token_ids

    assert asyncio.run(main()) == hf_greedy(model, [1, 2, 3], 3)


def test_before_step_runs_on_the_engine_thread_once_per_step(setup):
    import threading
    engine, model = setup
    calls = []
    engine.before_step = lambda: calls.append(threading.current_thread().name)
    try:
        async def main():
            return [o async for o in engine.generate("hook", prompts([5], seed=3)[0], greedy(6))]
        outs = asyncio.run(main())
    finally:
        engine.before_step = None
    assert len(outs) == 6 and calls == ["velocity-engine"] * 6     # one prefill step + five decode steps


def test_a_paused_request_waits_keeps_its_blocks_and_then_ends_as_it_would_have(setup):
    """pause(): no outputs while paused (the engine thread sleeps when nothing else runs), its KV
    blocks stay, and once resumed it finishes with the same tokens as without the pause."""
    import queue
    import time

    engine, model = setup
    p = prompts([9], seed=5)[0]
    got: queue.Queue = queue.Queue()
    outputs = 0

    def on_output(out) -> None:
        nonlocal outputs
        outputs += 1
        if outputs == 1:            # paused from the engine thread itself: before its next step,
            engine.pause("p")       # however quick the steps are
        got.put(out)

    engine.add_request("p", p, greedy(20), on_output)
    first = got.get(timeout=60)
    time.sleep(0.2)                                            # outputs already under way drain
    while not got.empty():
        got.get()
    steps, used = engine.steps, engine.engine.block_manager.num_used_blocks
    time.sleep(0.5)
    assert got.empty() and engine.steps == steps and used > 0          # asleep, blocks kept
    assert engine.engine.stats().paused == 1
    engine.pause("p", False)
    while not (out := got.get(timeout=60)).finished:
        pass
    assert out.token_ids == hf_greedy(model, p, 20) and first.token_ids == out.token_ids[:1]
    assert engine.engine.block_manager.num_used_blocks == 0
