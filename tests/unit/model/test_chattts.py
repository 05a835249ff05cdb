"""ChatTTS GPT on velocity: the release layout loads, frames match a plain reference, speakers,
per-request sampling, end token, text refine, bad requests."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from chattts_ref import RefChatTTS
from velocity import LLM, SamplingParams
from velocity.model.loading.loader import WeightError
from checkpoints import tiny_checkpoint

TEXTS = ["hello", "hello world this is speech", "你好世界", "a", "the world and you and it is to speech",
         "这是一个测试"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("chattts") / "tiny", seed=0)


@pytest.fixture(scope="module")
def ref(ckpt):
    return RefChatTTS(ckpt)


@pytest.fixture(scope="module")
def prompts(ref):
    return [ref.ids(f"[Stts][spk_emb][speed_5]{t}[Ptts]") for t in TEXTS]


@pytest.fixture(scope="module")
def speakers():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(64, generator=g) for _ in TEXTS]


def greedy(n=16, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=n, **kw)


def sampled(seed=None, **kw):
    return SamplingParams(temperature=1.0, top_p=0.9, top_k=20, repetition_penalty=1.05, repetition_window=16,
                          max_new_tokens=16, seed=seed, **kw)


def make_llm(ckpt, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("block_size", 4)
    kw.setdefault("num_kv_blocks", 512)
    return LLM(str(ckpt), **kw)


def test_writer_uses_the_release_names_and_the_loader_reads_sizes_from_files(ckpt):
    asset = ckpt / "asset"
    for f in ["gpt/config.json", "gpt/model.safetensors", "Embed.safetensors", "tokenizer/tokenizer.json",
              "tokenizer/tokenizer_config.json"]:
        assert (asset / f).is_file(), f
    with safe_open(str(asset / "Embed.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"emb_text.weight", "emb_code.3.weight", "head_text.parametrizations.weight.original0",
            "head_code.0.parametrizations.weight.original1"} <= names
    with safe_open(str(asset / "gpt" / "model.safetensors"), "pt") as f:
        assert "layers.0.self_attn.q_proj.weight" in f.keys() and "norm.weight" in f.keys()
    m = make_llm(ckpt).engine.worker.model
    assert (m.num_vq, m.num_audio_tokens, m.num_text_tokens) == (4, 626, 1024)
    assert m.heads["audio"].stop_ids == {625}


def test_greedy_frames_equal_reference_with_speakers_prefix_cache_and_preemption(ckpt, ref, prompts, speakers):
    refs = [ref.greedy_frames(p, 16, s) for p, s in zip(prompts, speakers)]
    for kw in [dict(), dict(num_kv_blocks=14, preemption_mode="recompute"),
               dict(num_kv_blocks=14, preemption_mode="swap"), dict(enable_prefix_caching=False)]:
        llm = make_llm(ckpt, **kw)
        outs = llm.generate(prompts, greedy(), speakers=speakers)
        got = [o.token_ids for o in outs]
        for i, (g, r) in enumerate(zip(got, refs)):
            assert g == r, f"{kw} prompt {i}:\n velocity:  {g}\n reference: {r}"
        if "num_kv_blocks" in kw:
            assert llm.engine.scheduler.num_preemptions > 0
        again = [o.token_ids for o in llm.generate(prompts, greedy(), speakers=speakers)]   # prefix cache warm
        assert again == refs
        assert llm.engine.block_manager.num_used_blocks == 0


def test_a_client_that_takes_its_share_by_preemption_changes_no_ones_frames(ckpt, ref, prompts, speakers):
    """Client a fills the batch (max_num_seqs 4), then client b asks: a's newest sequences are
    preempted for b (recomputed later); every sequence's frames equal the reference's (greedy)
    and its seeded frames equal those it samples alone."""
    n = len(prompts)
    params = [greedy() if i % 2 else sampled(seed=i) for i in range(n)]
    alone = [make_llm(ckpt).generate([p], q, speakers=[s])[0].token_ids for p, q, s in zip(prompts, params, speakers)]
    refs = [ref.greedy_frames(p, 16, s) if i % 2 else None for i, (p, s) in enumerate(zip(prompts, speakers))]
    engine = make_llm(ckpt, max_num_seqs=4).engine
    done = {}

    def step() -> None:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids

    for i in range(4):
        engine.add_request(f"a{i}", prompts[i], params[i], speaker=speakers[i], client="a")
    step()
    step()
    for i in range(4, n):
        engine.add_request(f"b{i}", prompts[i], params[i], speaker=speakers[i], client="b")
    step()
    assert engine.scheduler.num_preemptions == 2 and engine.stats().clients == 2
    assert sorted(s.request_id for s in engine.scheduler.running) == ["a0", "a1", "b4", "b5"]
    while engine.has_unfinished():
        step()
    got = [done[f"{'a' if i < 4 else 'b'}{i}"] for i in range(n)]
    assert got == alone
    assert all(g == r for g, r in zip(got, refs) if r is not None)
    assert engine.block_manager.num_used_blocks == 0


def test_greedy_unchanged_by_sampling_neighbours_and_seeds_reproducible(ckpt, prompts, speakers):
    llm = make_llm(ckpt)
    alone = llm.generate([prompts[1]], greedy(), speakers=[speakers[1]])[0].token_ids
    seeded_alone = llm.generate([prompts[2]], sampled(seed=42))[0].token_ids
    batch = llm.generate(prompts, [sampled(), greedy(), sampled(seed=42), sampled(seed=7),
                                   SamplingParams(temperature=[0.5, 1, 1.5, 2], max_new_tokens=16), sampled()],
                         speakers=[speakers[0], speakers[1], None, speakers[3], None, None])
    assert batch[1].token_ids == alone
    assert batch[2].token_ids == seeded_alone
    assert llm.generate([prompts[2]], sampled(seed=43))[0].token_ids != seeded_alone


def test_a_different_speaker_changes_frames_and_never_shares_kv(ckpt, prompts, speakers):
    llm = make_llm(ckpt)
    a = llm.generate([prompts[1]], greedy(), speakers=[speakers[0]])[0].token_ids
    hits = llm.engine.block_manager.num_prefix_hits
    b = llm.generate([prompts[1]], greedy(), speakers=[speakers[1]])[0].token_ids
    assert a != b
    assert llm.engine.block_manager.num_prefix_hits == hits       # nothing reused across speakers
    c = llm.generate([prompts[1]], greedy(), speakers=[speakers[0].clone()])[0].token_ids
    assert c == a and llm.engine.block_manager.num_prefix_hits > hits   # the same speaker reuses its KV
    d = llm.generate([prompts[1]], greedy(), speakers=[speakers[0] * 3.0])[0].token_ids
    assert d == a                                                       # L2-normalised: scale is ignored


@pytest.fixture(scope="module")
def eager_end(ckpt, tmp_path_factory):
    """The tiny checkpoint with code 625 of head 0 scaled up, so the end token comes early."""
    out = tmp_path_factory.mktemp("end") / "ckpt"
    shutil.copytree(ckpt, out)
    f = out / "asset" / "Embed.safetensors"
    t = load_file(str(f))
    t["head_code.0.parametrizations.weight.original0"][625] = 40.0
    save_file(t, str(f))
    return out


def test_end_token_min_and_max_new_tokens(eager_end, prompts):
    ref = RefChatTTS(eager_end)
    llm = make_llm(eager_end)
    free = llm.generate(prompts, greedy(64))
    assert any(o.finish_reason == "stop" for o in free)
    for p, o in zip(prompts, free):
        assert o.token_ids == ref.greedy_frames(p, 64)
        if o.finish_reason == "stop":
            assert 625 in o.token_ids[-1] and all(625 not in f for f in o.token_ids[:-1])
    held = llm.generate(prompts, greedy(64, min_new_tokens=10))
    for p, o in zip(prompts, held):
        assert len(o.token_ids) >= 10 and all(625 not in f for f in o.token_ids[:10])
        assert o.token_ids == ref.greedy_frames(p, 64, min_new=10)
    short = llm.generate(prompts, greedy(3, ignore_eos=True))
    assert all(len(o.token_ids) == 3 and o.finish_reason == "length" for o in short)


def test_text_refine_head_until_ebreak(ckpt, ref, prompts):
    llm = make_llm(ckpt)
    ps = [ref.ids(f"[Sbreak]{t}[Pbreak][oral_2][laugh_0][break_6]") for t in TEXTS[:3]]
    outs = llm.generate(ps, greedy(20), head="text")
    for p, o in zip(ps, outs):
        assert all(isinstance(t, int) for t in o.token_ids)
        assert o.token_ids == ref.greedy_text(p, 20)


@pytest.mark.parametrize("bad,match", [
    (dict(prompt=list(range(5)) * 500), "prompt length 2500 must be below max_model_len=2048"),
    (dict(speaker=torch.randn(63)), "speaker must be 64 floats, got 63"),
    (dict(speaker=torch.full((64,), float("nan"))), "speaker must hold finite floats"),
    (dict(params=dict(temperature=-1.0)), "temperature must be >= 0"),
    (dict(params=dict(top_p=1.5)), r"top_p must be in \(0, 1\]"),
    (dict(params=dict(top_k=-2)), "top_k must be an integer >= 0"),
    (dict(params=dict(temperature=[1.0, 1.0])), "temperature has 2 values; the model has 4 codebooks"),
    (dict(prompt=[5000]), r"text token ids \(integers in \[0, 1024\)\)"),
    (dict(prompt=[5, (1, 2, 3, 625)]), r"audio frames \(4 codes in \[0, 625\)\)"),
    (dict(prompt=[5, (1, 2, 3)]), r"audio frames \(4 codes"),
    (dict(prompt=[5, (1, 2, 3, 4), 6]), "audio frames must come after all of its text tokens"),
])
def test_bad_requests_clear_errors_and_engine_goes_on(ckpt, prompts, speakers, bad, match):
    llm = make_llm(ckpt)
    prompt = bad.get("prompt", prompts[0])
    with pytest.raises(ValueError, match=match):
        params = SamplingParams(**{"max_new_tokens": 4, **bad.get("params", {})})
        llm.engine.add_request("bad", prompt, params, speaker=bad.get("speaker"))
    out = llm.generate([prompts[0]], greedy(4), speakers=[speakers[0]])[0]
    assert len(out.token_ids) == 4 and llm.engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("damage,match", [
    ("missing_embed", "Embed.safetensors: weights file missing"),
    ("wrong_shape", "'layers.1.mlp.down_proj.weight' has shape"),
    ("config_disagrees", "says hidden_size=96"),
    ("truncated", "cannot read safetensors"),
    ("missing_tensor", "head_code.2.parametrizations.weight.original1 missing"),
])
def test_broken_folders_name_the_file_and_tensor(ckpt, tmp_path, damage, match):
    out = tmp_path / "c"
    shutil.copytree(ckpt, out)
    asset = out / "asset"
    if damage == "missing_embed":
        (asset / "Embed.safetensors").unlink()
    elif damage == "wrong_shape":
        t = load_file(str(asset / "gpt" / "model.safetensors"))
        t["layers.1.mlp.down_proj.weight"] = t["layers.1.mlp.down_proj.weight"][:, :-1].contiguous()
        save_file(t, str(asset / "gpt" / "model.safetensors"))
    elif damage == "config_disagrees":
        cfg = (asset / "gpt" / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 96')
        (asset / "gpt" / "config.json").write_text(cfg)
    elif damage == "truncated":
        f = asset / "gpt" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:5000])
    elif damage == "missing_tensor":
        t = load_file(str(asset / "Embed.safetensors"))
        del t["head_code.2.parametrizations.weight.original1"]
        save_file(t, str(asset / "Embed.safetensors"))
    with pytest.raises(WeightError, match=match):
        make_llm(out)


@pytest.mark.parametrize("cpu_kernel", [True, False])
def test_decode_inputs_updated_from_the_last_step_equal_inputs_built_again(eager_end, prompts, speakers, cpu_kernel):
    """ModelRunner.next_decode (positions + 1, new blocks written in, rows leaving) gives the
    frames and hidden states of prepare's inputs built from the sequences, bit for bit: with
    the C++ decode kernel and with the masked attention, through preemption and tables that
    outgrow their room (block size 1)."""
    import numpy as np

    params = [sampled(seed=i, ignore_eos=i % 3 != 1) for i in range(len(prompts))]
    for p in params:
        p.max_new_tokens = 40
    runs = {}
    for reuse in (False, True):
        llm = make_llm(eager_end, block_size=1, num_kv_blocks=120, cpu_kernel=cpu_kernel)
        runner = llm.engine.worker.runner
        runner.reuse_decode_inputs = reuse
        inner, followed = runner.next_decode, []

        def counted(seqs, inner=inner, followed=followed):
            got = inner(seqs)
            followed.append(got is not None)
            return got

        runner.next_decode = counted
        outs = llm.generate(prompts, params, speakers=speakers, return_hidden=True)
        runs[reuse] = outs, sum(followed), llm.engine.scheduler.num_preemptions
    (built, _, pre), (followed, n, pre2) = runs[False], runs[True]
    assert pre > 0 and pre2 == pre and n > 30            # preempted, and most decodes followed on
    for a, b in zip(built, followed):
        assert a.token_ids == b.token_ids and np.array_equal(a.hidden, b.hidden)
