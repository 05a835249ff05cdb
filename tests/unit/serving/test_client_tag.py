"""The CLIENT input's signature (velocity.serving.wire.client_tag): only a value signed with the run's
client key names a client; a forged, altered or unsigned one is the one client "" of direct callers."""
from velocity.serving.wire.client_tag import KEY_FILE, load_key, sign, verify


def test_only_values_signed_with_the_runs_key_name_a_client(tmp_path):
    (tmp_path / KEY_FILE).write_text("00112233445566778899aabbccddeeff\n")
    key = load_key(str(tmp_path))
    sa, sb = sign("address:127.0.0.2", key), sign("key:sk-secret", key)
    a, b = verify(sa, key), verify(sb, key)
    assert a and b and a != b and len(a) == 16 and "127.0.0.2" not in sa and "sk-secret" not in sb
    assert sign("address:127.0.0.2", key) == sa                       # one client, one tag
    other = sign("address:127.0.0.2", b"another key")
    forged = [a, f"{a}.0123456789abcdef", other, other.replace(other.split(".")[0], a),
              sa[:-1] + ("0" if sa[-1] != "0" else "1"), sa.replace(a, b), "", ".", None]
    assert [verify(v, key) for v in forged] == [""] * len(forged)
    assert verify(sa, None) == "" and sign("address:127.0.0.2", None) == "" and sign("", key) == ""
    assert load_key("") is None and load_key(str(tmp_path / "none")) is None
