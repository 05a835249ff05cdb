"""Settings from the environment: each variable read as its setting's type, an on/off setting as
a word (bool("0") would be True), and a value that is neither refused naming its variable."""
from __future__ import annotations

from dataclasses import fields

import pytest

from velocity.serving.settings import Settings

ON_OFF = [f.name for f in fields(Settings) if isinstance(f.default, bool)]


def test_the_on_off_settings_are_bools():
    assert set(ON_OFF) >= {"voice_carry_over", "lend_vocoder_cores", "pack_cpu_weights", "cpu_kernel",
                           "gpu_kernels", "graph_sampler", "gateway_long_text"}


@pytest.mark.parametrize("raw, want", [("0", False), ("1", True), ("false", False), ("TRUE", True),
                                       (" off ", False), ("On", True), ("no", False), ("yes", True)])
def test_an_on_off_setting_reads_its_words(monkeypatch, raw, want):
    for name in ON_OFF:
        monkeypatch.setenv(f"VELOCITY_{name.upper()}", raw)
    s = Settings.from_env()
    assert {name: getattr(s, name) for name in ON_OFF} == dict.fromkeys(ON_OFF, want)


@pytest.mark.parametrize("name, raw", [("cpu_kernel", "maybe"), ("gateway_long_text", ""), ("max_num_seqs", "many")])
def test_a_value_of_the_wrong_kind_names_its_variable(monkeypatch, name, raw):
    monkeypatch.setenv(f"VELOCITY_{name.upper()}", raw)
    with pytest.raises(ValueError, match=f"VELOCITY_{name.upper()}={raw!r}"):
        Settings.from_env()


def test_other_settings_keep_their_types(monkeypatch):
    monkeypatch.setenv("VELOCITY_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("VELOCITY_BACKLOG_SECONDS", "2.5")
    monkeypatch.setenv("VELOCITY_DEVICE", "cpu")
    s = Settings.from_env()
    assert (s.max_num_seqs, s.backlog_seconds, s.device) == (7, 2.5, "cpu")


def test_the_gateway_names_an_unknown_http_parser(monkeypatch):
    """VELOCITY_GATEWAY_HTTP picks uvicorn's parser; a word it does not know stops the gateway at
    once with the variable and the choices, before anything listens."""
    from velocity.gateway import app

    monkeypatch.setenv("VELOCITY_GATEWAY_HTTP", "nginx")
    with pytest.raises(SystemExit, match="VELOCITY_GATEWAY_HTTP='nginx'.*httptools or h11"):
        app.main(["--triton", "127.0.0.1:1", "--port", "0"])


@pytest.mark.parametrize("raw, cuda, cpu", [("auto", True, False), ("on", True, True), ("0", False, False),
                                            (" OFF ", False, False)])
def test_overlapped_steps_are_on_with_cuda_unless_told(monkeypatch, raw, cuda, cpu):
    monkeypatch.setenv("VELOCITY_OVERLAP_STEPS", raw)
    s = Settings.from_env()
    assert (s.overlap("cuda"), s.overlap("cpu")) == (cuda, cpu)


def test_an_unknown_overlap_word_names_its_variable_and_choices(monkeypatch):
    monkeypatch.setenv("VELOCITY_OVERLAP_STEPS", "sometimes")
    with pytest.raises(ValueError, match="VELOCITY_OVERLAP_STEPS='sometimes'.*auto, on or off"):
        Settings.from_env().overlap("cpu")
