#!/usr/bin/env python3
"""Tokenizer fixtures and reference ids for Kiln's CLIP BPE and T5 Unigram tokenizers.

Two steps:
  python3 tools/refs/tokenizers.py fixtures   # writes tests/data/tokenizers/{clip,t5}/ (needs pip download)
  python3 tools/refs/tokenizers.py refs       # writes tests/data/refs/tokenizers.json

Fixtures are in the real on-disk formats:
  clip/: vocab.json + merges.txt laid out exactly like openai/clip-vit-large-patch14 (the HF repo that FLUX's
         tokenizer/ folder copies), built from the real CLIP BPE table that open_clip_torch ships
         (bpe_simple_vocab_16e6.txt.gz), plus FLUX's tokenizer_config.json / special_tokens_map.json.
  t5/:   no PyPI package ships T5's spiece.model, so a small genuine SentencePiece Unigram model is trained here
         with T5's settings (pad=0, eos=1, unk=2, no bos, nmt_nfkc normaliser), and tokenizer.json is written by
         transformers' own conversion (what T5TokenizerFast loads), with the 100 <extra_id_N> sentinels.

Reference ids come from transformers (CLIPTokenizer / CLIPTokenizerFast, T5Tokenizer / T5TokenizerFast; in
transformers 5 each pair is one tokenizers-backed class, and the script asserts the pairs agree), called the
way the diffusers pipelines call them: padding="max_length", truncation=True.
"""
import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile

# This file's name shadows the `tokenizers` package when run as a script: drop its folder from the path.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
CLIP_DIR = os.path.join(DATA, "tokenizers", "clip")
T5_DIR = os.path.join(DATA, "tokenizers", "t5")
REFS = os.path.join(DATA, "refs", "tokenizers.json")


def bytes_to_unicode():
    # GPT-2/CLIP byte -> printable character table.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def make_clip_fixture():
    tmp = tempfile.mkdtemp()
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, "open-clip-torch==3.3.0"])
    wheel = glob.glob(os.path.join(tmp, "open_clip_torch-*.whl"))[0]
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("open_clip/bpe_simple_vocab_16e6.txt.gz")).decode("utf-8")
    shutil.rmtree(tmp)
    lines = raw.split("\n")
    # Same cut as CLIP's SimpleTokenizer: skip the version line, keep 49152-256-2 merges.
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    byte_chars = list(bytes_to_unicode().values())
    vocab = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408
    os.makedirs(CLIP_DIR, exist_ok=True)
    with open(os.path.join(CLIP_DIR, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(CLIP_DIR, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    special = lambda content, normalized: {  # noqa: E731
        "content": content, "lstrip": False, "normalized": normalized, "rstrip": False, "single_word": False}
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            "49406": dict(special("<|startoftext|>", True), special=True),
            "49407": dict(special("<|endoftext|>", False), special=True),
        },
        "bos_token": "<|startoftext|>",
        "clean_up_tokenization_spaces": True,
        "do_lower_case": True,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 77,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "CLIPTokenizer",
        "unk_token": "<|endoftext|>",
    }
    with open(os.path.join(CLIP_DIR, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    specials = {
        "bos_token": special("<|startoftext|>", True),
        "eos_token": special("<|endoftext|>", False),
        "pad_token": "<|endoftext|>",
        "unk_token": special("<|endoftext|>", False),
    }
    with open(os.path.join(CLIP_DIR, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)


def t5_corpus():
    rng = random.Random(1234)
    text = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="ignore") as f:
                text.extend(l.strip() for l in f if l.strip())
    words = [w for l in text for w in l.split()]
    extra = ["café", "naïve", "résumé", "Zürich", "São Paulo", "Ångström", "ﬁne", "①", "ｆｕｌｌｗｉｄｔｈ", "½",
             "a photo of a cat", "an astronaut riding a horse on the moon", "4k, highly detailed", "don't", "it's",
             "Ünïcödé", "élève", "naïve façade", "Crème brûlée", "mañana", "Straße", "–", "—", "“quoted”", "‘single’"]
    for _ in range(4000):
        sent = [rng.choice(words) for _ in range(rng.randint(3, 14))]
        sent.insert(rng.randint(0, len(sent)), rng.choice(extra))
        if rng.random() < 0.3:
            sent.append(str(rng.randint(0, 100000)))
        text.append(" ".join(sent))
    return text


def make_t5_fixture():
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    os.makedirs(T5_DIR, exist_ok=True)
    # A fixed work folder: the trainer records the corpus path inside spiece.model, so this keeps it reproducible.
    work = os.path.join(tempfile.gettempdir(), "kiln-t5-fixture")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(t5_corpus()) + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(work, "spiece"), model_type="unigram", vocab_size=2000,
        character_coverage=0.9995, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
        unk_piece="<unk>", normalization_rule_name="nmt_nfkc", num_threads=1, seed_sentencepiece_size=200000,
        shuffle_input_sentence=False, input_sentence_size=0, minloglevel=2)
    shutil.copy(os.path.join(work, "spiece.model"), os.path.join(T5_DIR, "spiece.model"))
    # Convert the way a T5 repo gets its tokenizer.json: T5TokenizerFast from the slow model, then save.
    conv = os.path.join(work, "conv")
    os.makedirs(conv)
    shutil.copy(os.path.join(work, "spiece.model"), conv)
    tok = T5TokenizerFast.from_pretrained(conv, extra_ids=100, model_max_length=512, legacy=True)
    out = os.path.join(work, "out")
    tok.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copy(os.path.join(out, name), os.path.join(T5_DIR, name))
    shutil.rmtree(work)


T5_VARIANT_DIR = os.path.join(DATA, "tokenizers", "t5_variant")
CLIP_G_DIR = os.path.join(DATA, "tokenizers", "clip_g")


def make_variant_fixtures():
    """Small config variants exercising code paths the main fixtures do not:
    clip_g/: SD3's CLIP-G special tokens (pad_token "!", id 0); vocab and merges are clip/'s.
    t5_variant/: a tokenizer.json with a newer-style Metaspace (prepend_scheme "first", no WhitespaceSplit) and
    a Sequence of Strip / Replace(regex) / Lowercase / NFC normalisers instead of the precompiled charsmap."""
    os.makedirs(CLIP_G_DIR, exist_ok=True)
    with open(os.path.join(CLIP_DIR, "tokenizer_config.json")) as f:
        config = json.load(f)
    bang = {"content": "!", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    config["added_tokens_decoder"] = dict({"0": dict(bang, special=True)}, **config["added_tokens_decoder"])
    config["pad_token"] = "!"
    with open(os.path.join(CLIP_G_DIR, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(CLIP_DIR, "special_tokens_map.json")) as f:
        specials = json.load(f)
    specials["pad_token"] = bang
    with open(os.path.join(CLIP_G_DIR, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)

    os.makedirs(T5_VARIANT_DIR, exist_ok=True)
    with open(os.path.join(T5_DIR, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": False, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        {"type": "Lowercase"},
        {"type": "NFC"}]}
    tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    with open(os.path.join(T5_VARIANT_DIR, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)


PROMPTS = [
    "",
    "a photo of a cat",
    "A Photo Of A CAT",
    "an astronaut riding a horse on the moon, 4k, highly detailed, trending on artstation",
    "Hello, world! How's it going?",
    "wow!!! ... ??? -- ;; :) wow! great!! !",
    "(masterpiece:1.2), [best quality], {detailed}, <lora:style:0.8>",
    "1234567890 3.14159 1,000,000 2024-01-01 12:30pm",
    "I'm sure they'll say it's fine, we've done what we'd planned; don't you think? IT'S DON'T",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n  mixed \u3000 ideographic\u00a0nbsp   spaces",
    "café naïve résumé Zürich São Paulo Ångström",
    "cafe\u0301 nai\u0308ve A\u030a \u1100\u1161\u11a8",
    "ÀÉÎÕÜ ÇÑ İstanbul ΣΊΣΥΦΟΣ straße",
    "東京タワーの夜景、中文提示词：一只猫",
    "한국어 텍스트",
    "🐱 cat 😀👍🏽 👨‍👩‍👧 🇯🇵🇫🇷 flags ❤️",
    "Москва and Αθήνα with עברית and العربية and हिन्दी क्षत्रिय",
    "<|startoftext|> already <|endoftext|> and <|ENDOFTEXT|>",
    "</s> and <pad> and <extra_id_0> and <unk> <extra_id_99><extra_id_5>x",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ﬁ ligature ① ½ ™ ℃ ㍿",
    "qzxjvw supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "bell\x07char zero\u200bwidth soft\u00adhyphen \ufeffbom",
    "“smart quotes” ‘single’ — em dash – en dash … ellipsis",
    "x" * 300,
    " ".join(["a beautiful landscape painting of mountains"] * 40),
    "ｶﾞｷﾞ ﾊﾟ halfwidth",
]


def random_prompts(count=40, seed=7):
    """Seeded random strings mixing the scripts and character kinds the normalisers and pre-tokenisers treat
    specially: combining marks, Hangul jamo, Indic conjuncts, emoji modifiers/ZWJ/flags, full-width and
    compatibility characters, unusual whitespace and controls, apostrophes, digits, special-token fragments."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t\n\r\u3000\u00a0\u2009\u0085",
        "'''sdtmlrev", ".,;:!?-()[]{}<>|/\\@#$%^&*_+=~`\"", "\u0300\u0301\u0308\u0323\u0327\u030a\u0345\u05b0",
        "àéîõüçñÅøßæœİıΣσςΑΩЖжЯ", "\u1100\u1161\u11a8\uac00\ud55c", "\u0915\u094d\u0937\u093f\u0928\u200d",
        "\U0001F600\U0001F44D\U0001F3FD\u200d\u2764\ufe0f\U0001F1EF\U0001F1F5\U0001F468\U0001F469",
        "東京中文日本語カタカナひらがな", "ＡＢＣａｂｃ１２３ﬁﬂ①½™℃㍿ｶﾞﾊﾟ", "\x00\x07\x1b\u200b\u00ad\ufeff\u2028",
        "\u0e01\u0e33\u0627\u0644\u05e9", "\U00010400\U0001D400\U00020000"]
    specials = ["<|endoftext|>", "<|startoftext|>", "</s>", "<pad>", "<extra_id_3>", "<unk>", "<|", "</"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.04:
                parts.append(rng.choice(specials))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def make_refs():
    from tokenizers import Tokenizer
    from transformers import CLIPTokenizer, CLIPTokenizerFast, T5Tokenizer, T5TokenizerFast
    import transformers

    prompts = PROMPTS + random_prompts()
    out = {"transformers": transformers.__version__, "prompts": prompts, "cases": []}

    def add(name, fixture, max_length, results):
        out["cases"].append({"name": name, "fixture": fixture, "max_length": max_length, "results": results})

    def hf_results(toks, max_length):
        results = []
        for p in prompts:
            encs = [t(p, padding="max_length", max_length=max_length, truncation=True) for t in toks]
            plain = [t(p, add_special_tokens=False)["input_ids"] for t in toks]
            for e, q in zip(encs[1:], plain[1:]):
                assert e["input_ids"] == encs[0]["input_ids"] and q == plain[0], p
            results.append({"ids": encs[0]["input_ids"], "mask": encs[0]["attention_mask"], "tokens": plain[0]})
        return results

    clip = [CLIPTokenizer.from_pretrained(CLIP_DIR), CLIPTokenizerFast.from_pretrained(CLIP_DIR)]
    add("clip_l", "clip", 77, hf_results(clip, 77))
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(CLIP_DIR, name), tmp)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(CLIP_G_DIR, name), tmp)
        clip_g = [CLIPTokenizer.from_pretrained(tmp), CLIPTokenizerFast.from_pretrained(tmp)]
        assert clip_g[0].pad_token_id == 0
        add("clip_g", "clip_g", 77, hf_results(clip_g, 77))

    t5 = [T5TokenizerFast.from_pretrained(T5_DIR), T5Tokenizer.from_pretrained(T5_DIR)]
    with tempfile.TemporaryDirectory() as tmp:
        # spiece.model alone: transformers converts it; the ids must be the same as from tokenizer.json.
        shutil.copy(os.path.join(T5_DIR, "spiece.model"), tmp)
        t5.append(T5Tokenizer.from_pretrained(tmp, extra_ids=100))
        for max_length in (256, 512):
            add("t5_%d" % max_length, "t5", max_length, hf_results(t5, max_length))

    plain = Tokenizer.from_file(os.path.join(T5_VARIANT_DIR, "tokenizer.json"))
    variant = Tokenizer.from_file(os.path.join(T5_VARIANT_DIR, "tokenizer.json"))
    variant.enable_truncation(64)
    variant.enable_padding(length=64, pad_id=0, pad_token="<pad>")
    results = []
    for p in prompts:
        e = variant.encode(p)
        results.append({"ids": e.ids, "mask": e.attention_mask, "tokens": plain.encode(p, add_special_tokens=False).ids})
    add("t5_variant", "t5_variant", 64, results)

    # Unicode building blocks, from Python's own implementations: NFC (unicodedata), lower-casing per character
    # (str.lower, as Rust's char::to_lowercase), extended grapheme clusters (the regex package's \\X).
    import regex
    import unicodedata
    extra = ["\u0915\u094d\u0937\u093f", "e\u0301\u0323", "\u1e0b\u0323", "a\u0328\u0301\u0301",
             "\U0001F469\U0001F3FD\u200d\U0001F52C", "\r\n\n", "\u0e01\u0e33", "\U0001F1E6\U0001F1E7\U0001F1E8",
             "\u00c5\u212b\u0041\u030a", "\ud55c\u1100\u1161\u11a8\u11a8"]
    out["unicode"] = [{"text": t, "nfc": unicodedata.normalize("NFC", t), "lower": "".join(c.lower() for c in t),
                       "graphemes": [len(g) for g in regex.findall(r"\X", t)]} for t in prompts + extra]

    os.makedirs(os.path.dirname(REFS), exist_ok=True)
    with open(REFS, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "refs"
    if what == "fixtures":
        make_clip_fixture()
        make_t5_fixture()
        make_variant_fixtures()
    else:
        make_refs()
