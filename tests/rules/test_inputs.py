"""The request table (velocity/serving/wire/input_table.py) and what is derived from it, without a server:
the parser's checks, the files scripts/gen_inputs.py writes, the gateway's body fields and the
client's options. That the running models declare the table's inputs is in test_tts_server.py."""
from __future__ import annotations

import functools
import importlib.util
import json
import math

import numpy as np
import pytest

from triton_server import ROOT
from velocity.sampling_params import SamplingParams, chattts_params, refine_params
from velocity.serving.wire.input_table import BY_NAME, INPUTS, JSON, NUMPY, read_inputs, triton_inputs
from velocity.serving.settings import Settings

SETTINGS = Settings(max_new_tokens=300, max_text_chars=50)


def gen_inputs():
    spec = importlib.util.spec_from_file_location("gen_inputs", ROOT / "scripts" / "gen_inputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read(**values) -> dict:
    arrays = {k: np.array([v], dtype=NUMPY[BY_NAME[k].dtype]) for k, v in values.items()}
    return read_inputs(arrays.get, SETTINGS)


def test_the_configs_and_the_api_page_are_written_from_the_table():
    """scripts/gen_inputs.py --check: the inputs of the ensemble, of text_frontend and of
    tts_offline, the ensemble's map into text_frontend and docs/api.md's table are what the table
    writes (edit the table, then run the script)."""
    stale = gen_inputs().stale()
    assert not stale, "".join(stale) + "\nrun: .venv/bin/python scripts/gen_inputs.py"


def test_a_changed_row_makes_the_files_stale(monkeypatch):
    """The check above can fail: a new input shows up in every file's differences (three configs,
    the API page)."""
    import velocity.serving.wire.input_table as inputs

    mod = gen_inputs()
    extra = inputs.Input("LOUDNESS", "FP32", "an example input", 1.0, lo=0)
    monkeypatch.setattr(mod, "INPUTS", (*inputs.INPUTS, extra))
    monkeypatch.setattr(inputs, "INPUTS", (*inputs.INPUTS, extra))
    diffs = mod.stale()
    assert len(diffs) == 4 and all("LOUDNESS" in d for d in diffs), diffs


def test_each_models_inputs():
    for model in ("text_frontend", "tts", "tts_offline"):
        specs = triton_inputs(model)
        assert [s["name"] for s in specs] == [i.name for i in INPUTS]
        assert {s["dims"] == ([1] if model == "text_frontend" else [1, 1]) for s in specs} == {True}
        text = specs[0]
        assert text["name"] == "TEXT" and text["optional"] == (model == "tts")   # the ensemble's text_frontend says it
        assert all(s["optional"] for s in specs[1:])


def test_the_defaults_are_the_references():
    from velocity.tts.frontend import DEFAULT_PROMPT
    from velocity.tts.audio_decoder import DECODERS

    for prefix, params in (("", chattts_params()), ("REFINE_", refine_params())):
        for name in ("TEMPERATURE", "TOP_P", "TOP_K", "REPETITION_PENALTY"):
            assert BY_NAME[prefix + name].default == getattr(params, name.lower()), prefix + name
    assert BY_NAME["REFINE_MAX_NEW_TOKENS"].default == refine_params().max_new_tokens
    assert BY_NAME["PROMPT"].default == DEFAULT_PROMPT
    assert set(BY_NAME["DECODER"].choices) == set(DECODERS) and BY_NAME["DECODER"].default in DECODERS


@pytest.mark.parametrize("name", ["TEMPERATURE", "TOP_P", "TOP_K", "REPETITION_PENALTY", "MAX_NEW_TOKENS"])
def test_the_ranges_agree_with_sampling_params(name):
    """At and around each bound, the table's range and SamplingParams.validate accept the same
    values (the engine's API checks them too), and the error names the input and its range."""
    i = BY_NAME[name]
    hi = SETTINGS.max_new_tokens if name == "MAX_NEW_TOKENS" else i.hi
    step = 1 if i.dtype.startswith("INT") else 1e-3
    for v in {i.lo - step, i.lo, i.lo + step, *((hi - step, hi, hi + step) if hi is not None else (1e6,))}:
        v = int(v) if step == 1 else float(v)
        try:
            SamplingParams(**{name.lower(): v})
            engine_ok = name != "MAX_NEW_TOKENS" or v <= hi
        except ValueError:
            engine_ok = False
        try:
            read(TEXT="hi", **{name: v})
            ok = True
        except ValueError as e:
            ok = False
            assert str(e).startswith(f"{name} must be {i.allowed(SETTINGS)}, got "), e
        assert ok == engine_ok, (name, v)
    with pytest.raises(ValueError, match=f"{name} must be"):
        read(TEXT="hi", **{name: math.nan} if i.dtype == "FP32" else {name: -(2**31)})


def test_one_pass_reads_and_checks_everything():
    v = read(TEXT="Hi.", SEED=7, DECODER=" codes ", REFINE_TEXT=True, REFINE_TOP_K=3)
    assert v["TEXT"] == "Hi." and v["SEED"] == 7 and v["DECODER"] == "codes" and v["REFINE_TOP_K"] == 3
    assert v["REFINE_TEXT"] is True and v["VOICE"] is None and set(v) == set(BY_NAME)
    assert read(TEXT="Hi.", DECODER="  ")["DECODER"] == "hidden"
    for bad, match in [({}, "TEXT is required"), ({"TEXT": "x" * 51}, "TEXT has 51 characters; the limit is 50"),
                       ({"TEXT": "hi", "SEED": -1}, r"SEED must be in \[0, 2\^63\), got -1"),
                       ({"TEXT": "hi", "REFINE_TOP_P": 0.5}, "REFINE_TOP_P is for text refine: send REFINE_TEXT true"),
                       ({"TEXT": "hi", "SAMPLE_TEXT": "x"}, "SAMPLE_TEXT is the transcript of SPEAKER_SAMPLE"),
                       ({"TEXT": "hi", "DECODER": "mel"}, "DECODER must be one of 'hidden', 'codes'")]:
        with pytest.raises(ValueError, match=match):
            read(**bad)
    with pytest.raises(ValueError, match="TOP_K must be an integer, got data type float32"):
        read_inputs({"TEXT": np.array([b"hi"], object), "TOP_K": np.array([1.5], np.float32)}.get, SETTINGS)
    with pytest.raises(ValueError, match="SEED must hold one value, got 2"):
        read_inputs({"TEXT": np.array([b"hi"], object), "SEED": np.array([1, 2])}.get, SETTINGS)


def test_the_gateway_takes_every_inputs_field():
    """Each input with an API field goes from the body to its input, type-checked."""
    from velocity.gateway.speech_request import triton_values as values_of
    from velocity.gateway.speech_schema import speech_model
    from velocity.gateway.upstream import ApiError

    model = speech_model()
    triton_values = functools.partial(values_of, model)
    base = {"model": "tts-1", "voice": "amber", "input": "Hi."}
    sample = {"BYTES": "[oral_2]", "BOOL": True, "INT32": 3, "INT64": 5, "FP32": 0.5}
    fields = [i for i in INPUTS if i.api_field]
    assert {i.api_field for i in fields} >= {"seed", "temperature", "top_p", "top_k", "max_new_tokens", "refine",
                                             "speaker_sample", "sample_text"}
    for i in fields:
        got = triton_values(base | {i.api_field: sample[i.dtype]}, {"amber": "speaker"})[0]
        assert got[i.name] == sample[i.dtype], i.name
        wrong = "x" if i.dtype != "BYTES" else 3
        kind = "a JSON object" if i.json else JSON[i.dtype].__name__
        with pytest.raises(ApiError, match=f"{i.api_field} must be {kind}"):
            triton_values(base | {i.api_field: wrong}, {"amber": "speaker"})
        if i.json:                                # the object itself, as its JSON text
            got = triton_values(base | {i.api_field: {"SQL": "sequel"}}, {"amber": "speaker"})[0]
            assert json.loads(got[i.name]) == {"SQL": "sequel"}


def test_the_body_model_is_the_table():
    """The gateway's body model (its validation and its OpenAPI page) has a field for each input
    with a body field: its type, its range, and the table's help as its description."""
    from velocity.gateway.speech_schema import OPENAI, speech_model

    props = speech_model(SETTINGS).model_json_schema()["properties"]
    fields = [i for i in INPUTS if i.api_field]
    assert set(props) == set(OPENAI) | {i.api_field for i in fields}
    json_type = {"BYTES": "string", "BOOL": "boolean", "INT32": "integer", "INT64": "integer", "FP32": "number"}
    for i in fields:
        p = props[i.api_field]
        assert p["description"] == i.describe(), i.name
        kinds = {t.get("type") for t in p["anyOf"]} - {"null"}
        assert kinds == ({"object", "string"} if i.json else {json_type[i.dtype]}), (i.name, p)
        t = next(t for t in p["anyOf"] if t.get("type") != "null")
        if i.lo is not None:
            assert t["exclusiveMinimum" if i.lo_open else "minimum"] == i.lo, (i.name, p)
        hi = i.limit(i.hi, SETTINGS)
        if hi is not None:
            assert t["exclusiveMaximum" if i.hi_open else "maximum"] == hi, (i.name, p)
    assert props["max_new_tokens"]["anyOf"][0]["maximum"] == SETTINGS.max_new_tokens     # the server's limit


def test_a_new_input_reaches_the_body_model_with_no_other_line():
    """An input added to the table is a body field: validated with its range, shown with its help."""
    from velocity.gateway.speech_request import triton_values
    from velocity.gateway.speech_schema import read_body, speech_model
    from velocity.gateway.upstream import ApiError
    from velocity.serving.wire.input_table import Input

    table = (*INPUTS, Input("PITCH", "FP32", "a new input: the voice's pitch", 1.0, lo=0.5, hi=2))
    model = speech_model(SETTINGS, table)
    assert model.model_json_schema()["properties"]["pitch"]["description"].startswith("a new input")
    base = {"model": "tts-1", "voice": "amber", "input": "Hi."}
    assert read_body(model, base | {"pitch": 1.5}, SETTINGS, table).pitch == 1.5
    with pytest.raises(ApiError, match=r"pitch must be in \[0.5, 2\], got 3") as e:
        read_body(model, base | {"pitch": 3}, SETTINGS, table)
    assert e.value.param == "pitch"
    with pytest.raises(ApiError, match="pitch must be float, got 'high'"):
        read_body(model, base | {"pitch": "high"}, SETTINGS, table)
    assert "pitch" not in speech_model(SETTINGS).model_fields            # the table's own model is unchanged
    assert triton_values(speech_model(SETTINGS), base | {"pitch": 3}, {"amber": "speaker"})[0] == {
        "TEXT": "Hi.", "PROMPT": "[speed_5]", "VOICE": "amber"}       # not in the table: an unknown field, ignored


def test_the_client_has_an_option_for_each_input():
    """velocity-tts-client's options come from the table: each sends its input, unset ones nothing."""
    from client.tts_client import parse_args
    from velocity.serving.wire.input_table import INPUTS

    sample = {"BYTES": "x", "INT32": "3", "INT64": "5", "FP32": "0.5"}
    for i in INPUTS:
        if i.cli_flag is None:
            continue
        argv = ["hi", i.cli_flag] + ([] if i.dtype == "BOOL" else [i.choices[-1] if i.choices else sample[i.dtype]])
        args = parse_args(argv)
        want = True if i.dtype == "BOOL" else JSON[i.dtype](argv[-1])
        assert getattr(args, i.name) == want, i.name
        assert [n for n in BY_NAME if BY_NAME[n].cli_flag and getattr(args, n) is not None] == [i.name]
    with pytest.raises(SystemExit):
        parse_args(["hi", "--voice", "a", "--speaker-seed", "3"])        # one voice at most
