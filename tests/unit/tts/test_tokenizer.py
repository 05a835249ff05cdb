"""velocity's BERT tokenizer (the `tokenizers` library alone) == transformers' AutoTokenizer on the
same asset/tokenizer folder: ids, decoded text and vocabulary, clean-up on and off. The folder is
written in the release's layout, whose tokenizer.json pads and truncates to 256."""
from __future__ import annotations

import json
import random
import shutil

import pytest

from velocity.demo.checkpoint import write_tokenizer
from velocity.tts.tokenizer import BertTokenizer

VOCAB = 21178    # the release's size: every CJK character of the demo vocabulary is in it
TEXTS = [
    "[Stts][empty_spk][speed_5]Hello, World! It's fine, isn't it? We've gone.[Ptts]",
    "[Sbreak]你好，世界。我们走吧！[Pbreak][oral_2]",
    "Café naïve ÀÉÎ Zürich ﬁ ½ ①", "don't  stop . ok ?  'quoted' ", "\t\n tab\u200bzero\u00a0nbsp",
    "[uv_break]嗯[laugh]ha ha[lbreak]", "[SPEED_5] [speed_5x] [speed_5]", "x" * 120 + " y",
    "a" * 300, "12,345.67 - (tests); \"quotes\" 😀 ok", "",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{clean_up: folder}: our writer's folder as it is, and with the release's clean-up flag."""
    plain = tmp_path_factory.mktemp("tok") / "plain"
    write_tokenizer(plain, VOCAB)
    clean = plain.with_name("clean")
    shutil.copytree(plain, clean)
    conf = json.loads((clean / "tokenizer_config.json").read_text())
    (clean / "tokenizer_config.json").write_text(json.dumps(conf | {"clean_up_tokenization_spaces": True}))
    return {False: plain, True: clean}


def random_texts(vocab: dict[str, int], n: int, seed: int) -> list[str]:
    """Strings of vocabulary entries, special tokens, punctuation and spaces, glued at random."""
    rng = random.Random(seed)
    pool = [t.removeprefix("##") for t in vocab] + list(" .,!?'\"-  \n") + ["n't", "'s", "A", "É"]
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 40))) for _ in range(n)]


@pytest.mark.parametrize("clean_up", [False, True])
def test_equals_transformers_auto_tokenizer(folders, clean_up):
    from transformers import AutoTokenizer

    folder = folders[clean_up]
    assert json.loads((folder / "tokenizer.json").read_text())["padding"]["strategy"] == {"Fixed": 256}
    ours, hf = BertTokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert ours.clean_up is clean_up
    vocab = ours.get_vocab()
    assert vocab == hf.get_vocab() and len(vocab) == VOCAB
    assert ours.tokens(range(VOCAB)) == hf.convert_ids_to_tokens(list(range(VOCAB)))
    for text in TEXTS + random_texts(vocab, 300, seed=int(clean_up)):
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), repr(text)
    rng = random.Random(7)
    punct = [vocab[p] for p in ".,!?'" if p in vocab] + [vocab["[UNK]"], vocab["[Stts]"]]
    for _ in range(400):                  # ids with punctuation often, so the clean-up has work
        ids = [rng.choice(punct) if rng.random() < 0.3 else rng.randrange(VOCAB) for _ in range(rng.randrange(1, 25))]
        assert ours.decode(ids) == hf.decode(ids), ids


def test_whole_prompts_are_not_cut_or_padded_to_the_files_256(folders):
    tok = BertTokenizer(folders[False])
    assert len(tok.encode("a " * 400)) == 400
    assert len(tok.encode("a")) == 1


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        BertTokenizer(tmp_path)
