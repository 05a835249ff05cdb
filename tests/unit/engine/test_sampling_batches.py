"""The eager sampler's batches kept from step to step (velocity.engine.sampling_rows.SamplingBatches):
the same tokens as batches made whole at every step, through a run whose batch changes."""
from __future__ import annotations

import torch

from checkpoints import tiny_checkpoint
from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine
from velocity.engine.sampling_rows import _Kept
from velocity.sampling_params import SamplingParams
from velocity.tts.pipeline import chattts_params
from velocity.tts.speaker import random_speaker


def requests(hidden: int) -> list[tuple[str, list[int], SamplingParams, object]]:
    """Rows of every kind: ChatTTS's sampling, other penalties and windows, greedy, a min_new_tokens,
    top-k or top-p alone; each seeded (an unseeded row draws fresh entropy)."""
    spk = torch.from_numpy(random_speaker(1, hidden))
    out = []
    for i in range(10):
        p = chattts_params(seed=i, max_new_tokens=40 + 3 * i)
        if i % 5 == 1:
            p.repetition_penalty, p.repetition_window = 1.3, 4
        if i % 5 == 2:
            p.temperature = 0.0                   # greedy
        if i % 5 == 3:
            p.min_new_tokens = 12
        if i % 5 == 4:
            p.top_k, p.top_p, p.repetition_penalty = 0, 0.9, 1.0
        out.append((f"r{i}", list(range(5, 20 + 2 * i)), p, spk if i % 2 else None))
    return out


def run(ck, keep: bool, monkeypatch) -> tuple[dict[str, list], int]:
    """Every request's tokens, and how many steps' batches were kept ones."""
    used = []
    with monkeypatch.context() as m:
        if not keep:
            m.setattr(_Kept, "of", classmethod(lambda cls, *a: None))
        else:
            next_batch = _Kept.next_batch
            m.setattr(_Kept, "next_batch", lambda self, device: used.append(1) or next_batch(self, device))
        eng = LLMEngine(EngineConfig(model=str(ck), device="cpu", max_num_seqs=8))
        reqs = requests(eng.model.config.hidden_size)
        for rid, prompt, p, spk in reqs[:6]:
            eng.add_request(rid, prompt, p, speaker=spk)
        got: dict[str, list] = {}
        steps = 0
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    got[out.request_id] = out.token_ids
            steps += 1
            if steps == 15:                           # later rows join (and wait: 8 at most at once)
                for rid, prompt, p, spk in reqs[6:]:
                    eng.add_request(rid, prompt, p, speaker=spk)
    return got, len(used)


def test_kept_batches_sample_what_whole_batches_do(tmp_path, monkeypatch):
    ck = tiny_checkpoint(tmp_path / "tiny", seed=3)
    whole, _ = run(ck, False, monkeypatch)
    kept, used = run(ck, True, monkeypatch)
    assert len(whole) == 10 and used > 40, used
    assert kept == whole
