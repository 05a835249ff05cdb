"""ChatTTS's control tokens ([uv_break], [laugh], [speed_5], [oral_2], [break_6] ...): the one
pattern the text front end and the gateway both read them by (plain `re`: the gateway imports
it without the normaliser's number libraries)."""
import re

CONTROL = re.compile(r"\[(?:uv_break|v_break|lbreak|laugh|speed_\d|oral_\d|laugh_\d|break_\d)\]")
