"""The CLIENT input's signature (velocity.serving.client_tag): only a value signed with the run's
client key names a client; a forged, altered or unsigned one is the one client "" of direct callers."""
from velocity.gateway.caller import tag
from velocity.serving.client_tag import KEY_FILE, load_key, sign, verify


def test_only_values_signed_with_the_runs_key_name_a_client(tmp_path):
    (tmp_path / KEY_FILE).write_text("00112233445566778899aabbccddeeff\n")
    key = load_key(str(tmp_path))
    a, b = tag("address:127.0.0.2"), tag("key:sk-secret")
    assert a != b and len(a) == 16 and "127.0.0.2" not in a and "sk-secret" not in b
    assert verify(sign(a, key), key) == a and verify(sign(b, key), key) == b
    forged = [a, f"{a}.0123456789abcdef", sign(a, b"another key")[:-1] + "0", sign(a, b"another key"),
              sign(a, key).replace(a, b), "", ".", None]
    assert [verify(v, key) for v in forged] == [""] * len(forged)
    assert verify(sign(a, key), None) == "" and sign(a, None) == "" and sign("", key) == ""
    assert load_key("") is None and load_key(str(tmp_path / "none")) is None
