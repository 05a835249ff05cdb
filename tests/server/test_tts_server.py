"""The `tts` stream on a real tritonserver with the tiny demo checkpoint: its audio equal to the
in-process pipeline's, its outputs (marks, words), its inputs checked, its metrics."""
from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client.triton import make_inputs, stream_grpc
from triton_server import assert_same_audio, llm_inputs, settle, wait_for
from velocity.tts.word_timing import client_words

from tts_calls import DEFAULT_VOICE_SEED, GOOD, SERVED, stream_tts, wav_bytes

pytestmark = pytest.mark.server


def test_stream_in_order_whole_frames_and_seeded(server):
    chunks, err = stream_tts(server.grpc_url, GOOD)
    assert err is None, server.log()
    assert [i for i, _ in chunks] == list(range(len(chunks))) and len(chunks) >= 2
    audio = np.concatenate([a for _, a in chunks])
    assert audio.dtype == np.float32 and len(audio) % 512 == 0 and 0 < len(audio) <= 2 * 24 * 512
    again, _ = stream_tts(server.grpc_url, GOOD)
    np.testing.assert_array_equal(np.concatenate([a for _, a in again]), audio)


def test_velocitys_log_lines_reach_the_server_log(server):
    """INFO lines of the engine (started in the llm's stub process) are in the server's log."""
    log = server.log_path.read_text(errors="replace")
    assert "[velocity] INFO velocity.engine.worker: CPU:" in log, log[-3000:]


@pytest.mark.parametrize("decoder", ["hidden", "codes"])
def test_served_audio_equals_the_in_process_pipeline_for_both_decoders(server, decoder):
    """The same seeded request through tts and through TTSPipeline with the server's chunking:
    the same frames, so the same length (each sentence 512 T - 256 samples), and the same audio
    within float32 rounding (>= 100 dB SNR; the vocoder runs in another process)."""
    from velocity.tts.pipeline import TTSPipeline, chattts_params

    values = dict(GOOD, **({} if decoder == "hidden" else {"DECODER": decoder}))
    chunks, err = stream_tts(server.grpc_url, values)
    assert err is None, err
    served = np.concatenate([a for _, a in chunks])
    pipe = TTSPipeline(server.env["VELOCITY_WEIGHTS"], device="cpu", schedule=SERVED, lookahead=4,
                       num_kv_blocks=64)
    local = pipe.synthesize(GOOD["TEXT"], decoder=decoder, speaker=DEFAULT_VOICE_SEED, params=chattts_params(
        temperature=GOOD["TEMPERATURE"], seed=GOOD["SEED"], max_new_tokens=GOOD["MAX_NEW_TOKENS"]))
    assert served.shape == local.shape and len(local) % 512 == 0          # two sentences
    noise = ((served - local) ** 2).sum()
    assert 10 * np.log10((local ** 2).sum() / max(noise, 1e-30)) >= 100
    if decoder == "codes":
        hidden, _ = stream_tts(server.grpc_url, GOOD)
        assert not np.allclose(np.concatenate([a for _, a in hidden]), served)     # the two paths differ


def test_voice_carry_over_through_the_server_equals_the_pipelines(server):
    """VOICE_CARRY_OVER true (the reference's voice carry-over, velocity.tts.carry_over): the
    served audio equals TTSPipeline(carry_over=True) with the server's chunking (>= 100 dB SNR,
    as without), differs from the audio without it, and is refused with text refine."""
    from velocity.tts.pipeline import TTSPipeline, chattts_params

    carried, err = stream_tts(server.grpc_url, {**GOOD, "VOICE_CARRY_OVER": True})
    assert err is None, err
    served = np.concatenate([a for _, a in carried])
    pipe = TTSPipeline(server.env["VELOCITY_WEIGHTS"], device="cpu", schedule=SERVED, lookahead=4,
                       num_kv_blocks=64)
    params = chattts_params(temperature=GOOD["TEMPERATURE"], seed=GOOD["SEED"], max_new_tokens=GOOD["MAX_NEW_TOKENS"])
    local = pipe.synthesize(GOOD["TEXT"], speaker=DEFAULT_VOICE_SEED, params=params, carry_over=True)
    assert served.shape == local.shape
    assert 10 * np.log10((local ** 2).sum() / max(((served - local) ** 2).sum(), 1e-30)) >= 100
    plain = np.concatenate([a for _, a in stream_tts(server.grpc_url, GOOD)[0]])
    assert plain.shape != served.shape or not np.allclose(plain, served, atol=1e-3)
    _, err = stream_tts(server.grpc_url, {**GOOD, "VOICE_CARRY_OVER": True, "REFINE_TEXT": True})
    assert err is not None and "VOICE_CARRY_OVER cannot be combined with REFINE_TEXT" in err, err
    # a direct llm caller's carry-over prompts that do not match its sentences, or hold no token
    # of the model: INVALID_ARG naming them
    from client.triton import array_inputs
    inputs = [i for i in llm_inputs(server.grpc_url, {**GOOD, "VOICE_CARRY_OVER": True})
              if i.name() not in ("CARRY_IDS", "CARRY_LENGTHS")]
    for ids, lengths, says in ((np.array([[5, 6, 7]]), np.array([[2, 2]]), "CARRY_LENGTHS must be positive and add up to"),
                               (np.array([[5, 10**6]]), np.array([[1, 1]]), "CARRY_IDS, sentence 1:")):
        errors = []
        g = grpcclient.InferenceServerClient(server.grpc_url)
        g.start_stream(callback=lambda result, error: errors.append(error) if error else None)
        g.async_stream_infer("llm", inputs + array_inputs(grpcclient, {"CARRY_IDS": ids.astype(np.int32),
                                                                      "CARRY_LENGTHS": lengths.astype(np.int32)}))
        assert wait_for(lambda: errors, timeout=60)
        g.stop_stream()
        assert says in str(errors[0]), errors


def test_offline_equals_stream_over_grpc_and_http(server):
    chunks, _ = stream_tts(server.grpc_url, GOOD)
    streamed = np.concatenate([a for _, a in chunks])
    g = grpcclient.InferenceServerClient(server.grpc_url)
    whole = g.infer("tts_offline", make_inputs(grpcclient, GOOD)).as_numpy("WAVEFORM").reshape(-1)
    np.testing.assert_allclose(whole, streamed, rtol=0, atol=0)
    with httpclient.InferenceServerClient(server.http_url) as h:
        via_http = h.infer("tts_offline", make_inputs(httpclient, GOOD), headers=server.http_headers
                           ).as_numpy("WAVEFORM").reshape(-1)
    np.testing.assert_array_equal(via_http, streamed)


def test_http_generate_stream(server):
    body = {"TEXT": "Hi there.", "SEED": 3, "MAX_NEW_TOKENS": 16}
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tts/generate_stream",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **server.http_headers})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.read().splitlines() if line.startswith(b"data: ")]
    chunks = [e for e in events if "WAVEFORM" in e]
    assert chunks and [e["CHUNK_INDEX"] for e in chunks] == list(range(len(chunks)))
    grpc_chunks, _ = stream_tts(server.grpc_url, body)
    np.testing.assert_allclose(np.concatenate([np.asarray(e["WAVEFORM"], np.float32) for e in chunks]),
                               np.concatenate([a for _, a in grpc_chunks]), rtol=0, atol=1e-6)


def test_sixteen_concurrent_streams(server):
    results = {}

    def run(i):
        results[i] = stream_tts(server.grpc_url, {"TEXT": f"Stream number {i}.", "SEED": i, "MAX_NEW_TOKENS": 20})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 16
    for i, (chunks, err) in results.items():
        assert err is None and chunks, (i, err)
        assert [c for c, _ in chunks] == list(range(len(chunks)))
    for i in (0, 9):   # what a stream got in the crowd is what it gets alone (seeded)
        alone, _ = stream_tts(server.grpc_url, {"TEXT": f"Stream number {i}.", "SEED": i, "MAX_NEW_TOKENS": 20})
        assert_same_audio(np.concatenate([a for _, a in results[i][0]]), np.concatenate([a for _, a in alone]))


@pytest.mark.parametrize("bad,match", [
    ({"TEXT": "   "}, "TEXT must not be empty"),
    ({"TEXT": "x" * 2001}, "TEXT has 2001 characters; the limit is 2000"),
    ({"TEXT": "hi", "TEMPERATURE": -1.0}, "TEMPERATURE must be >= 0"),
    ({"TEXT": "hi", "TOP_P": 1.5}, r"TOP_P must be in \(0, 1\]"),
    ({"TEXT": "hi", "TOP_K": -3}, "TOP_K must be >= 0"),
    ({"TEXT": "hi", "MAX_NEW_TOKENS": 0}, r"MAX_NEW_TOKENS must be in \[1, 200\]"),
    ({"TEXT": "hi", "MAX_NEW_TOKENS": 5000}, r"MAX_NEW_TOKENS must be in \[1, 200\]"),
    ({"TEXT": "hi", "SPEAKER": "not a speaker"}, "SPEAKER is not a valid speaker string"),
    ({"TEXT": "hi", "PROMPT": "say it"}, "PROMPT must hold only control tokens"),
    ({"TEXT": "hi", "DECODER": "mel"}, r"DECODER must be one of 'hidden', 'codes' \(default 'hidden'\), got 'mel'"),
    ({"TEXT": "hi", "SAMPLE_TEXT": "hello"}, "SAMPLE_TEXT is the transcript of SPEAKER_SAMPLE"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": "not a sample"}, "SPEAKER_SAMPLE string"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": b"RIFF\x00\x01garbage"}, "nor audio soundfile can read"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": b"\xff\xfe\x00\x01"}, "neither a sample string nor a WAV"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": wav_bytes(0)}, "SPEAKER_SAMPLE audio is empty"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": wav_bytes(1.0, amp=0.0)}, "SPEAKER_SAMPLE audio is silent"),
    ({"TEXT": "hi", "SPEAKER_SAMPLE": wav_bytes(21.0)}, r"21.00 s long; it must be 0.2-20 s"),
    ({"TEXT": "hi", "LEXICON": "{NASA: nasa}"}, "LEXICON is not valid JSON"),
    ({"TEXT": "hi", "LEXICON": '{"NASA": 1}'}, "LEXICON: the replacement of 'NASA' must be a string"),
    ({"TEXT": "hi", "REFINE_PROMPT": "[oral_2]"}, "REFINE_PROMPT is for text refine: send REFINE_TEXT true"),
    ({"TEXT": "hi", "REFINE_TEXT": True, "REFINE_PROMPT": "be funny"}, "REFINE_PROMPT must hold only control tokens"),
    ({"TEXT": "hi", "REFINE_TEXT": True, "REFINE_TOP_P": 2.0}, r"REFINE_TOP_P must be in \(0, 1\]"),
    ({"TEXT": "hi", "REFINE_TEXT": True, "REFINE_MAX_NEW_TOKENS": 5000}, r"REFINE_MAX_NEW_TOKENS must be in \[1, 1024\]"),
])
def test_bad_inputs_invalid_arg_then_good_request(server, bad, match):
    import re
    # Streaming through the ensemble: gRPC stream errors carry a message but no status code.
    chunks, err = stream_tts(server.grpc_url, bad)
    assert err is not None and re.search(match, err) and not chunks, err
    # Unary: INVALID_ARGUMENT (gRPC) and 400 (HTTP), with the same message.
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(server.grpc_url).infer("tts_offline", make_inputs(grpcclient, bad))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and re.search(match, e.value.message()), e.value
    # closed here: the exception's traceback would hold its connection open until a garbage
    # collection, and Triton waits for open HTTP connections when it stops
    with httpclient.InferenceServerClient(server.http_url) as h, pytest.raises(InferenceServerException) as e:
        h.infer("tts_offline", make_inputs(httpclient, bad), headers=server.http_headers)
    assert e.value.status() == "400" and re.search(match, e.value.message()), e.value
    ok, err2 = stream_tts(server.grpc_url, {"TEXT": "fine.", "MAX_NEW_TOKENS": 8, "SEED": 1})
    assert err2 is None and ok


def test_a_request_lexicon_says_its_words_its_way(server):
    """LEXICON replaces whole words before normalisation: the audio is the replaced text's, through
    the stream and tts_offline, and not the original's (seeded)."""
    base = {"SEED": 3, "MAX_NEW_TOKENS": 16, "TEMPERATURE": 0.8}
    lexicon = json.dumps({"NASA": "the agency", "sql": "sequel"})
    said, err = stream_tts(server.grpc_url, {**base, "TEXT": "NASA uses SQL.", "LEXICON": lexicon})
    assert err is None, err
    meant, _ = stream_tts(server.grpc_url, {**base, "TEXT": "the agency uses sequel."})
    plain, _ = stream_tts(server.grpc_url, {**base, "TEXT": "NASA uses SQL."})
    audio = np.concatenate([a for _, a in said])
    np.testing.assert_array_equal(audio, np.concatenate([a for _, a in meant]))
    assert not np.array_equal(audio[:4000], np.concatenate([a for _, a in plain])[:4000])
    whole = grpcclient.InferenceServerClient(server.grpc_url).infer(
        "tts_offline", make_inputs(grpcclient, {**base, "TEXT": "NASA uses SQL.", "LEXICON": lexicon}))
    assert_same_audio(whole.as_numpy("WAVEFORM").reshape(-1), audio)


def test_each_chunk_says_its_sentence_its_sample_offset_and_the_sentences_text(server):
    """SENTENCE_INDEX, SAMPLE_OFFSET and SENTENCE_TEXT: the offsets are the samples streamed before
    each chunk, the sentences go in order, and each sentence's first chunk carries its text as
    the front end made it."""
    from velocity.tts.frontend import TextFrontend

    text = "Hello world. 你好，世界。 A third sentence here."
    marks: list = []
    chunks = list(stream_grpc(server.grpc_url, {"TEXT": text, "SEED": 2, "MAX_NEW_TOKENS": 24}, marks=marks))
    assert [m[0] for m in marks] == [c for c, _ in chunks]
    assert [m[2] for m in marks] == [sum(len(a) for _, a in chunks[:k]) for k in range(len(chunks))]
    sentences, _ = TextFrontend(server.env["VELOCITY_WEIGHTS"]).encode(text, speaker=True)
    order = [m[1] for m in marks]
    assert order == sorted(order) and set(order) == set(range(len(sentences))) == {0, 1, 2}
    firsts = [m for k, m in enumerate(marks) if k == 0 or marks[k - 1][1] != m[1]]
    assert [m[3] for m in firsts] == [s.text for s in sentences]
    assert all(m[3] == "" for m in marks if m not in firsts)


def test_each_chunk_carries_the_words_that_start_in_it(server):
    """WORDS: every word the client wrote comes once, in order, with the chunk whose audio it is
    estimated to start in; it ends by its sentence's exact end, and a sentence's words lie within
    its audio. "$5" is read "five dollars", and the word named is the client's."""
    text = "Hello world, it costs $5. 你好，世界。 A third sentence, said slowly and clearly."
    marks: list = []
    chunks = list(stream_grpc(server.grpc_url, {"TEXT": text, "SEED": 2, "MAX_NEW_TOKENS": 60}, marks=marks))
    sizes = {index: len(a) for index, a in chunks}
    words = [(w, m) for m in marks for w in m[4]]
    assert [w["word"] for w, _ in words] == client_words(text)
    assert {w["word"]: w["spoken"] for w, _ in words}["$5."] == "five dollars."
    ends = {}                                 # sentence -> its audio's end in the stream
    for m in marks:
        ends[m[1]] = m[2] + sizes[m[0]]
    starts = {m[1]: m[2] for m in reversed(marks)}
    for w, m in words:
        assert m[2] <= w["start"] < m[2] + sizes[m[0]] or w["start"] == m[2] + sizes[m[0]] == ends[m[1]], (w, m[:3])
        assert starts[m[1]] <= w["start"] <= w["end"] <= ends[m[1]], (w, m[:3])
    assert [w["start"] for w, _ in words] == sorted(w["start"] for w, _ in words)


def test_the_models_declare_the_request_tables_inputs(server):
    """The inputs of text_frontend, tts_offline and the ensemble, written into their configs from
    velocity/serving/wire/input_table.py (test_inputs.py checks the files), are what the server loaded.
    text_frontend has one more, CHECK_ONLY (tts_offline's check of a request)."""
    from velocity.serving.wire.input_table import triton_inputs

    c = grpcclient.InferenceServerClient(server.grpc_url)
    for model in ("text_frontend", "tts_offline", "tts"):
        got = c.get_model_config(model, as_json=True)["config"]["input"]
        extra = [("CHECK_ONLY", "TYPE_BOOL", [1], True)] if model == "text_frontend" else []
        assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]], bool(i.get("optional"))) for i in got] == \
            [(i["name"], i["data_type"], i["dims"], i["optional"]) for i in triton_inputs(model)] + extra, model


def test_a_stream_without_text_is_an_error_not_silence(server):
    """Triton 2.51 checks required inputs only when the input count is off: a `tts` request with
    SEED but no TEXT used to end with an empty final response (HTTP 200, no audio). TEXT is
    optional in the ensemble's config so text_frontend always runs and says it is required."""
    chunks, err = stream_tts(server.grpc_url, {"SEED": 3})
    assert not chunks and err is not None and "TEXT is required" in err, err
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tts/generate_stream",
                                 data=json.dumps({"text": "lowercase key", "SEED": 3}).encode(), headers=server.http_headers)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 400 and "TEXT is required" in e.value.read().decode()


def test_a_json_value_of_the_wrong_type_is_refused_by_triton_itself(server):
    """Documented in the README: Triton's HTTP front end parses the body before any model sees it
    and answers a wrong JSON type with 500 "Unable to parse 'data'" (2.51); nothing breaks."""
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tts/generate_stream",
                                 data=json.dumps({"TEXT": "Hi.", "TEMPERATURE": "hot"}).encode(), headers=server.http_headers)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 500 and "Unable to parse 'data'" in e.value.read().decode()
    ok, err = stream_tts(server.grpc_url, {"TEXT": "still fine.", "MAX_NEW_TOKENS": 8, "SEED": 1})
    assert err is None and ok


@pytest.mark.parametrize("name,dt,arr,match", [
    ("TEMPERATURE", "INT32", np.array([[1]], np.int32), "TEMPERATURE.*data-type"),
    ("TEXT", "BYTES", np.array([[b"a", b"b"]], dtype=object), "shape for input 'TEXT'"),
])
def test_wrong_dtype_or_shape_is_invalid_arg(server, name, dt, arr, match):
    import re
    inputs = [] if name == "TEXT" else make_inputs(grpcclient, {"TEXT": "hi"})
    t = grpcclient.InferInput(name, list(arr.shape), dt)
    t.set_data_from_numpy(arr)
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(server.grpc_url).infer("tts_offline", inputs + [t])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and re.search(match, e.value.message()), e.value


def test_non_utf8_text_is_rejected(server):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    t = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    t.set_data_from_numpy(np.array([[b"\xff\xfe bad"]], dtype=object))
    with pytest.raises(InferenceServerException, match="TEXT must be UTF-8") as e:
        g.infer("tts_offline", [t])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_metrics_count_frames_chunks_and_first_chunks(server):
    before = server.metric("velocity_frames_generated_total")
    chunks, decode = server.metric("velocity_vocoder_chunks_total"), server.metric("velocity_vocoder_decode_seconds_total")
    stream_tts(server.grpc_url, {"TEXT": "Count my frames.", "SEED": 5, "MAX_NEW_TOKENS": 12})
    # counted in the processes, published four times a second (velocity.serving.metrics)
    assert wait_for(lambda: server.metric("velocity_frames_generated_total") > before, 2)
    assert wait_for(lambda: server.metric("velocity_vocoder_chunks_total") > chunks, 2)
    assert wait_for(lambda: server.metric("velocity_vocoder_decode_seconds_total") > decode, 2)
    assert wait_for(lambda: server.metric("velocity_time_to_first_chunk_seconds_count") >= 1, 2)
    assert wait_for(lambda: server.metric("velocity_kv_blocks_used") == 0 and server.metric("velocity_kv_blocks_free") > 0)


def test_the_llm_borrows_the_idle_vocoders_threads_only_while_it_is_idle(server):
    """Core lending through the real server: steps run with the vocoder's threads too while no
    vocoder decodes; none while a vocoder is marked busy (here: this test holding a mark)."""
    import time

    from velocity.serving.boards.core_board import CoreBoard

    def settled() -> float:
        time.sleep(0.6)                                   # the llm exports the counter every 0.25 s
        return server.metric("velocity_llm_lent_steps_total")

    before = settled()
    assert stream_tts(server.grpc_url, GOOD)[1] is None
    lent = settled()
    assert lent > before
    path = server.core_board()
    assert path.parent.name.startswith("velocity-serve.")                 # serve.sh's run folder
    board = CoreBoard(path)
    assert board.claim() is not None
    try:
        with board.busy():
            assert stream_tts(server.grpc_url, GOOD)[1] is None
            assert settled() == lent
    finally:
        board.close()
    assert stream_tts(server.grpc_url, GOOD)[1] is None
    assert settled() > lent


def test_text_refine_through_the_server_equals_the_pipeline_and_returns_the_refined_text(server):
    """REFINE_TEXT: the llm runs the text head on each sentence first, then speaks the refined text.
    Greedy throughout: the same refined texts (on each sentence's first chunk, REFINED_TEXT) and
    the same audio as TTSPipeline(refine=...); tts_offline joins the texts; without refine, other audio."""
    from client.triton import stream_grpc
    from velocity.tts.pipeline import TTSPipeline, chattts_params, refine_params

    values = {"TEXT": "First one. Second one.", "TEMPERATURE": 0.0, "MAX_NEW_TOKENS": 12, "REFINE_TEXT": True,
              "REFINE_TEMPERATURE": 0.0, "REFINE_MAX_NEW_TOKENS": 10, "REFINE_PROMPT": "[oral_2][laugh_0][break_6]"}
    texts: list = []
    served = np.concatenate([a for _, a in stream_grpc(server.grpc_url, values, timeout=120, texts=texts)])
    pipe = TTSPipeline(server.env["VELOCITY_WEIGHTS"], device="cpu", schedule=SERVED, lookahead=4,
                       num_kv_blocks=64)
    chunks = list(pipe.stream(values["TEXT"], speaker=DEFAULT_VOICE_SEED, params=chattts_params(temperature=0, max_new_tokens=12),
                              refine=refine_params(temperature=0, max_new_tokens=10), refine_prompt=values["REFINE_PROMPT"]))
    assert texts == [c.text for c in chunks if c.text] and len(texts) == 2, texts
    assert_same_audio(served, np.concatenate([c.audio for c in chunks]))
    res = grpcclient.InferenceServerClient(server.grpc_url).infer("tts_offline", make_inputs(grpcclient, values))
    assert res.as_numpy("REFINED_TEXT").reshape(-1)[0].decode() == " ".join(texts)
    np.testing.assert_array_equal(res.as_numpy("WAVEFORM").reshape(-1), served)
    plain, err = stream_tts(server.grpc_url, {k: v for k, v in values.items() if not k.startswith("REFINE")})
    assert err is None and not np.array_equal(np.concatenate([a for _, a in plain]), served)


def test_a_refine_is_cancelled_like_the_rest(server):
    """A direct llm stream cancelled while its text head still refines (a long REFINE_MAX_NEW_TOKENS,
    greedy, which on the demo weights never samples [Ebreak]): the refine is aborted, its blocks are
    freed, no audio frame is generated."""
    settle(server)                          # the tests before counted and done: the counters are this test's
    idle_free = server.metric("velocity_kv_blocks_free")
    inputs = llm_inputs(server.grpc_url, {"TEXT": "Refine me for a long time.", "MAX_NEW_TOKENS": 40,
                                          "REFINE_TEXT": True, "REFINE_MAX_NEW_TOKENS": 1024,
                                          "REFINE_TEMPERATURE": 0.0})      # greedy: never [Ebreak] on these weights
    assert any(i.name() == "REFINE_IDS" for i in inputs)
    frames_before = server.metric("velocity_frames_generated_total")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.start_stream(callback=lambda result, error: None)
    g.async_stream_infer("llm", inputs, enable_empty_final_response=True)
    assert wait_for(lambda: server.metric("velocity_running_sequences") == 1, timeout=60)
    g.stop_stream(cancel_requests=True)     # at once: on a quick machine a later cancel finds the refine done
    assert wait_for(lambda: server.metric("velocity_kv_blocks_used") == 0 and
                    server.metric("velocity_running_sequences") == 0, timeout=60)
    # every block back (the gauges are a snapshot 4x a second: wait for the count itself)
    assert wait_for(lambda: server.metric("velocity_kv_blocks_free") == idle_free, timeout=60), server.metric("velocity_kv_blocks_free")
    assert server.metric("velocity_frames_generated_total") == frames_before
