"""LLMEngine's step in two halves, launch and collect, as the serving core overlaps them (the next
batch launched before the last one's outputs are handed on): the tokens of step() through a run
whose batch changes, requests added and aborted between the halves, a failed launch."""
from __future__ import annotations

import pytest
import torch

from checkpoints import tiny_checkpoint
from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine
from velocity.tts.pipeline import chattts_params

ADD_AT, ABORT_AT = 6, 9          # the launch after which later requests join, and "x" is aborted


def requests() -> list[tuple[str, list[int], object]]:
    """Seeded ChatTTS rows of different prompt and output lengths (an unseeded row draws fresh noise)."""
    return [(f"r{i}", list(range(5, 12 + 3 * i)), chattts_params(seed=i, max_new_tokens=14 + 5 * i))
            for i in range(6)] + [("x", list(range(7, 30)), chattts_params(seed=9, max_new_tokens=60))]


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("overlap") / "tiny", seed=2)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")])]


def engine(ck, device: str = "cpu") -> LLMEngine:
    """On CUDA with its defaults: the decode graphs, and the sampler inside them (a cache of its
    own size: two engines share the GPU)."""
    return LLMEngine(EngineConfig(model=str(ck), device=device, max_num_seqs=8, num_kv_blocks=256))


def run(eng: LLMEngine, overlapped: bool) -> tuple[dict[str, list], list[str]]:
    """Every request's tokens when it finished, and the ids of every finished output in order.
    Step k's batch is the same either way: what step() does after step k, the overlapped driver
    does between launch k and collect k (there step k's row of an aborted request is dropped)."""
    reqs = requests()
    first, later = reqs[:3] + reqs[-1:], reqs[3:-1]
    for rid, prompt, p in first:
        eng.add_request(rid, prompt, p)
    got: dict[str, list] = {}
    ended: list[str] = []

    def take(outs) -> None:
        for out in outs:
            assert out.error is None, out.error
            assert out.request_id not in got, f"an output of {out.request_id} after it finished"
            if out.finished:
                got[out.request_id] = out.token_ids
                ended.append(out.request_id)

    k = 0
    while eng.has_unfinished():
        if overlapped:
            outs = eng.collect()                  # step k's
            k += eng.launch()                     # step k + 1, before step k's outputs are read
            take(outs)
        else:
            k += 1
            take(eng.step())
        if k == ADD_AT and not any(r in eng.requests or r in got for r, *_ in later):
            for rid, prompt, p in later:
                eng.add_request(rid, prompt, p)
        if k == ABORT_AT and "x" in eng.requests:
            take([eng.abort("x")])
    return got, ended


@pytest.mark.parametrize("device", DEVICES)
def test_launch_and_collect_apart_give_the_tokens_of_step(ck, device):
    eng = engine(ck, device)
    plain, plain_ended = run(eng, False)
    eng2 = engine(ck, device)
    apart, apart_ended = run(eng2, True)
    assert set(apart) == set(plain) == {r for r, *_ in requests()}
    assert sorted(apart_ended) == sorted(plain_ended), "a request ended twice or not at all"
    for rid in plain:
        if rid != "x":
            assert apart[rid] == plain[rid], rid
    # "x" was aborted between launch ABORT_AT and its collect: that step's row was computed and dropped
    assert len(plain["x"]) == ABORT_AT and apart["x"] == plain["x"][:-1]
    for e in (eng, eng2):
        assert e.block_manager.num_used_blocks == 0 and not e.requests and not e.in_flight


def test_a_failed_launch_fails_its_batch_and_the_engine_goes_on(ck, monkeypatch):
    eng = engine(ck)
    for rid, prompt, p in requests()[:3]:
        eng.add_request(rid, prompt, p)
    for _ in range(3):
        eng.step()
    run_batch = eng.worker.runner.run

    def broken(seqs):
        raise RuntimeError("a device fault")

    monkeypatch.setattr(eng.worker.runner, "run", broken)
    assert eng.launch() and eng.in_flight
    failed = eng.collect()
    assert {o.request_id for o in failed} == {"r0", "r1", "r2"}
    assert all(o.finished and o.finish_reason == "error" and "a device fault" in o.error for o in failed)
    assert eng.block_manager.num_used_blocks == 0 and not eng.has_unfinished()
    monkeypatch.setattr(eng.worker.runner, "run", run_batch)
    rid, prompt, p = requests()[4]
    eng.add_request(rid, prompt, p)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].finished and outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == p.max_new_tokens
