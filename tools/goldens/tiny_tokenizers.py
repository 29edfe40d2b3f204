"""Small tokenizers in the real file formats, for the tiny test pipelines.

CLIP: the real CLIP BPE (tests/data/tokenizers/clip) cut to its first N merges. CLIP's vocabulary is by
construction 256 byte symbols, the same 256 with "</w>", one token per merge in merge order, then
<|startoftext|> and <|endoftext|>, so a prefix of the merges gives a genuine, smaller CLIP tokenizer
(unmerged text simply falls back to shorter pieces). T5: the committed SentencePiece model is already small.
"""
import json
import os
import shutil


def write_tiny_clip_tokenizer(src, dst, num_merges):
    os.makedirs(dst, exist_ok=True)
    vocab = json.load(open(os.path.join(src, "vocab.json"), encoding="utf-8"))
    lines = open(os.path.join(src, "merges.txt"), encoding="utf-8").read().split("\n")
    header, merges = lines[0], [m for m in lines[1:] if m]
    merges = merges[:num_merges]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    base = [tok for tok, i in by_id if i < 512]
    new_vocab = {tok: i for i, tok in enumerate(base)}
    for m in merges:
        a, b = m.split(" ")
        new_vocab.setdefault(a + b, len(new_vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        new_vocab[special] = len(new_vocab)
    with open(os.path.join(dst, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(new_vocab, f, ensure_ascii=False)
    with open(os.path.join(dst, "merges.txt"), "w", encoding="utf-8") as f:
        f.write(header + "\n" + "\n".join(merges) + "\n")
    cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
    n = len(new_vocab)
    cfg["added_tokens_decoder"] = {
        str(n - 2): dict(cfg["added_tokens_decoder"]["49406"]),
        str(n - 1): dict(cfg["added_tokens_decoder"]["49407"]),
    }
    json.dump(cfg, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=2)
    if os.path.exists(os.path.join(src, "special_tokens_map.json")):
        shutil.copy(os.path.join(src, "special_tokens_map.json"), dst)


def write_tiny_t5_tokenizer(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
