"""LLMEngine.hold: a request's outputs held until it has generated a given number of tokens more
(or ends), each then with every token and hidden row since its last; flush gives them at once."""
from __future__ import annotations

import numpy as np

from checkpoints import tiny_checkpoint
from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine
from velocity.tts.pipeline import chattts_params


def test_held_outputs_carry_every_token_and_hidden_row_since_the_last(tmp_path):
    """Two requests of the same seed and prompt, one held: the held one's outputs come at the
    counts it asked for, flush and its end, and together hold the tokens and hidden rows of the
    other's output every step; unreported counts what waits. Its neighbour's outputs come each step."""
    eng = LLMEngine(EngineConfig(model=str(tiny_checkpoint(tmp_path / "tiny", seed=1)), device="cpu", max_num_seqs=4))
    params = chattts_params(seed=3, max_new_tokens=23)
    params.ignore_eos = True                      # 23 tokens each
    for rid in ("every", "held"):
        eng.add_request(rid, list(range(5, 25)), params, return_hidden=True)
    outs: dict[str, list] = {"every": [], "held": []}
    at: list[int] = []                            # the held one's token counts at its outputs
    step = 0
    while eng.has_unfinished():
        step += 1
        for out in eng.step():
            outs[out.request_id].append(out)
            if out.request_id == "held":
                at.append(out.num_tokens)
                if not out.finished:
                    eng.hold("held", 5)
        if step == 13:                            # held since its 11th token: two wait
            assert eng.unreported("held") == 2 and eng.unreported("every") == 0
            got = eng.flush("held")
            assert got is not None and eng.flush("held") is None and eng.unreported("held") == 0
            outs["held"].append(got)
            at.append(got.num_tokens)
            eng.hold("held", 5)
    every, held = outs["every"], outs["held"]
    assert len(every) == 23 and all(len(o.new_token_ids) == 1 for o in every)
    assert at == [1, 6, 11, 13, 18, 23] and held[-1].finished and not any(o.finished for o in held[:-1])
    assert sum((o.new_token_ids for o in held), []) == sum((o.new_token_ids for o in every), []) == held[-1].token_ids
    np.testing.assert_array_equal(np.concatenate([o.new_hidden for o in held]),
                                  np.concatenate([o.new_hidden for o in every]))
    assert eng.sampled["audio"] == 46 and eng.block_manager.num_used_blocks == 0
