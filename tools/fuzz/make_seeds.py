"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from the committed fixtures and from
small tokenizer files made here with sentencepiece and tokenizers themselves.

The real fixtures are large (T5's spiece.model is 270 KB, most of it the precompiled charsmap); libFuzzer is
fastest on small inputs, so beside one real file per format this makes small ones that still reach every
part of the parsers: a SentencePiece model trained here with a few normalisation rules (a charsmap of a few
hundred bytes), its tokenizer.json as transformers converts it, a byte-level BPE tokenizer.json (the kind
FLUX.2's text encoders use), a CLIP vocabulary cut to a few hundred tokens, and hand-written safetensors,
index, config and command-line inputs; for FLUX.2 the committed Mistral, Tekken-pattern and Qwen3
tokenizer.json files, their pre-tokenizer patterns for the regex target, small PNGs of every colour type
for the png target, and request bodies of `kiln serve` for the serve_request target. Seeds are named by the SHA-1 of their bytes, as libFuzzer names corpus files.
Run from anywhere: python3 tools/fuzz/make_seeds.py [TARGET...]   (all targets when none is named)
"""

import hashlib
import json
import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
DATA = ROOT / "tests" / "data"

PROMPTS = [
    "a photo of a cat",
    "a big yellow triangle at the top, on a blue background",
    "A  Golden Retriever,\tsurfing a WAVE!! don't 1234",
    "<|startoftext|>hello<|endoftext|>",
    "</s> <pad> <unk> <extra_id_0> <extra_id_99>",
    "caf\u00e9 \u212b \ufb01 \u4e2d\u6587 \U0001f408 \u2581 \uff21\uff22",
    "",
]


def put(target, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def safetensors_bytes(tensors, metadata=None, pad_to=8):
    """tensors: list of (name, dtype, shape, raw bytes) in data order."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def safetensors_seeds():
    for f in ["io/dtypes.safetensors", "io/sharded-transformer/diffusion_pytorch_model-00002-of-00002.safetensors"]:
        put("safetensors", (DATA / f).read_bytes())
    small = [
        ("f32", "F32", [2, 2], struct.pack("<4f", 1, -2, 3.5, 0)),
        ("bf16", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
        ("f8", "F8_E4M3", [2, 2], bytes([0x38, 0x7F, 0xB8, 0x01])),
        ("f4", "F4", [4], bytes([0x12, 0xF7])),
        ("u64", "U64", [1], struct.pack("<Q", 2**63 + 1)),
        ("b", "BOOL", [2], b"\x00\x01"),
        ("scalar", "I16", [], b"\x07\x00"),
        ("empty", "F16", [0, 4], b""),
    ]
    put("safetensors", safetensors_bytes(small, {"format": "pt"}))
    put("safetensors", safetensors_bytes(small[:2], pad_to=1))
    put("safetensors", safetensors_bytes([]))


def checkpoint_index_seeds():
    index = json.loads((DATA / "io/sharded-transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    put("checkpoint_index", json.dumps(index, indent=2))
    names = sorted(index["weight_map"])
    one = {"metadata": {"total_size": 1}, "weight_map": {names[0]: index["weight_map"][names[0]]}}
    put("checkpoint_index", json.dumps(one))
    put("checkpoint_index", json.dumps({"weight_map": {names[0]: "../escape.safetensors"}}))
    put("checkpoint_index", json.dumps({"weight_map": {names[0]: "diffusion_pytorch_model-00003-of-00003.safetensors"}}))
    put("checkpoint_index", json.dumps({"metadata": [], "weight_map": {}}))


def config_json_seeds():
    seen = set()
    for path in sorted((DATA / "models").rglob("*.json")):
        if path.name in ("tokenizer.json", "vocab.json", "special_tokens_map.json") or "index" in path.name:
            continue
        text = path.read_text()
        if text not in seen:
            seen.add(text)
            put("config_json", text)
    put("config_json", json.dumps({"_class_name": "FluxTransformer2DModel", "num_layers": 2**40}))
    put("config_json", json.dumps({"_class_name": "AutoencoderKL", "block_out_channels": []}))
    put("config_json", json.dumps({"_class_name": "Flux2Transformer2DModel", "num_single_layers": 2**40}))
    put("config_json", json.dumps({"_class_name": "AutoencoderKLFlux2", "decoder_block_out_channels": [2**62]}))
    put("config_json", json.dumps({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
                                   "intermediate_size": 64, "num_hidden_layers": 2**40, "num_attention_heads": 0}))


FLUX2_TOKENIZERS = ["models/flux2-tiny-dev-full/tokenizer", "tokenizers/tekken", "models/flux2-tiny-klein-full/tokenizer"]


def flux2_tokenizer_json_seeds():
    for folder in FLUX2_TOKENIZERS + ["tokenizers/bpe_variants/behaviors", "tokenizers/bpe_variants/byte_fallback"]:
        put("tokenizer_json", (DATA / folder / "tokenizer.json").read_text())


def regex_seeds():
    patterns = set()
    for folder in FLUX2_TOKENIZERS + ["tokenizers/bpe_variants/behaviors"]:
        stack = [json.loads((DATA / folder / "tokenizer.json").read_text())]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if "Regex" in node and isinstance(node["Regex"], str):
                    patterns.add(node["Regex"])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    # GPT-2's (ByteLevel's use_regex), and constructs the patterns above do not use.
    patterns.add(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    patterns.update([r"(?>a+)b|a++c|x{2,4}?|[\x{1F600}-\x{1F64F}]|\u00e9|(?=\d)\w|(?!x).", r"(?i)ss|[\p{^L}]"])
    for pattern in sorted(patterns):
        for prompt in PROMPTS[:4] + ["  \r\n\t 12345 ..!! don't STOP", ""]:
            put("regex", pattern.encode() + b"\0" + prompt.encode())


def png_bytes(width, height, color_type, bit_depth, rows, extra=b"", interlace=0):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    raw = b"".join(b"\0" + row for row in rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def png_seeds():
    for name in ["ref_a.png", "ref_b.png"]:
        path = DATA / "goldens/flux2" / name
        if path.stat().st_size < 20000:
            put("png", path.read_bytes())
    w, h = 80, 64
    put("png", png_bytes(w, h, 2, 8, [bytes((x * 3 + y) % 256 for x in range(w * 3)) for y in range(h)]))  # RGB
    put("png", png_bytes(w, h, 0, 8, [bytes((x + y) % 256 for x in range(w)) for y in range(h)],
                         extra=struct.pack(">I", 9) + b"tEXtseed\x0042" + struct.pack(">I", zlib.crc32(b"tEXtseed\x0042"))))
    put("png", png_bytes(w, h, 4, 8, [bytes(x % 256 for x in range(w * 2)) for y in range(h)]))  # gray + alpha
    put("png", png_bytes(w, h, 6, 16, [bytes(x % 256 for x in range(w * 8)) for y in range(h)], interlace=1))
    palette = bytes(i % 256 for i in range(3 * 16))
    plte = struct.pack(">I", len(palette)) + b"PLTE" + palette + struct.pack(">I", zlib.crc32(b"PLTE" + palette))
    put("png", png_bytes(w, h, 3, 4, [bytes((x * 17) % 256 for x in range(w // 2)) for y in range(h)], extra=plte))
    put("png", png_bytes(64, 600, 2, 8, [bytes(192) for _ in range(600)]))  # too elongated
    put("png", png_bytes(20000, 1, 0, 8, [bytes(20000)]))  # above the maximum side


def gguf_seeds():
    for f in ["gguf/quant_types.gguf", "gguf/flux-tiny-dev-Q8_0.gguf"]:
        put("gguf", (DATA / f).read_bytes())


def clip_bpe_seeds():
    folder = DATA / "models/flux-tiny-schnell/tokenizer"
    vocab, merges = (folder / "vocab.json").read_text(), (folder / "merges.txt").read_text()
    config = (folder / "tokenizer_config.json").read_text()
    put("clip_bpe", "\0".join([vocab, merges, config]))
    put("clip_bpe", "\0".join([vocab, merges]))
    # A few hundred tokens: the byte alphabet with and without "</w>", the merges whose parts and result
    # survive, and the special tokens.
    full = json.loads(vocab)
    lines = merges.splitlines()
    keep = {t for t, i in full.items() if i < 512} | {"<|startoftext|>", "<|endoftext|>"}
    kept_merges = [lines[0]]
    for line in lines[1:]:
        a, b = line.split(" ")
        if a in keep and b in keep and len(kept_merges) < 120:
            keep.add(a + b)
            kept_merges.append(line)
    small = {t: i for i, t in enumerate(sorted(keep, key=lambda t: full.get(t, 1 << 30)))}
    small_config = json.loads(config)
    small_config["added_tokens_decoder"] = {
        str(small["<|startoftext|>"]): {"content": "<|startoftext|>", "special": True, "normalized": True},
        str(small["<|endoftext|>"]): {"content": "<|endoftext|>", "special": True, "lstrip": True},
    }
    put("clip_bpe", "\0".join([json.dumps(small), "\n".join(kept_merges) + "\n", json.dumps(small_config)]))


def small_sentencepiece(workdir):
    """A Unigram model trained here on the prompts, with normalisation rules that give a small charsmap."""
    import sentencepiece as spm

    text = Path(workdir) / "text.txt"
    text.write_text("\n".join(PROMPTS * 20 + ["the quick brown fox jumps over the lazy dog " * 3] * 20))
    rules = Path(workdir) / "rules.tsv"
    # source code points (hex, space-separated) -> target code points: fullwidth A/B, the fi ligature, NBSP.
    rules.write_text("FF21\t41\nFF22\t42\nFB01\t66 69\nA0\t20\n212B\tC5\n")
    prefix = str(Path(workdir) / "tiny")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=prefix, vocab_size=120, model_type="unigram", character_coverage=1.0,
        normalization_rule_tsv=str(rules), pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
        byte_fallback=False, hard_vocab_limit=False)
    return Path(prefix + ".model")


def sentencepiece_seeds(model_path):
    put("sentencepiece", (DATA / "tokenizers/t5/spiece.model").read_bytes())
    put("sentencepiece", model_path.read_bytes())
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(model_path.read_bytes())
    m.normalizer_spec.precompiled_charsmap = b""
    m.trainer_spec.byte_fallback = True
    for b in range(256):
        p = m.pieces.add()
        p.piece, p.score, p.type = "<0x%02X>" % b, 0.0, 6  # BYTE
    put("sentencepiece", m.SerializeToString())


def tokenizer_json_seeds(model_path, workdir):
    put("tokenizer_json", (DATA / "tokenizers/t5_variant/tokenizer.json").read_text())
    from transformers import T5TokenizerFast

    # transformers converts spiece.model into tokenizer.json (the Precompiled normaliser carries the charsmap).
    fast_dir = Path(workdir) / "t5"
    T5TokenizerFast(vocab_file=str(model_path), extra_ids=4).save_pretrained(str(fast_dir))
    converted = json.loads((fast_dir / "tokenizer.json").read_text())
    put("tokenizer_json", json.dumps(converted))
    # As the real T5 files have it: the model's charsmap as a Precompiled normaliser, the Metaspace sequence.
    from sentencepiece import sentencepiece_model_pb2 as pb
    import base64

    m = pb.ModelProto()
    m.ParseFromString(model_path.read_bytes())
    charsmap = base64.b64encode(m.normalizer_spec.precompiled_charsmap).decode()
    converted["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Precompiled", "precompiled_charsmap": charsmap},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    converted["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                      "split": True}]}
    put("tokenizer_json", json.dumps(converted))

    # A byte-level BPE (GPT-2/Mistral style), for the FLUX.2 tokenizer.json loader.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(PROMPTS * 10, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    put("tokenizer_json", bpe.to_str())


def tokenizer_text_seeds():
    for p in PROMPTS:
        put("tokenizer_text", p)
    # What FLUX.2's patterns split on: contractions in any case, digit runs, newlines, spaces before letters.
    put("tokenizer_text", "I'M SURE it's 2024\r\n\n  \tTHE fox's  den's 1234567 ...\n\n\u00c9T\u00c9 \u0130stanbul")
    put("tokenizer_text", "x" * 3000)
    put("tokenizer_text", " \t\n\u3000\u00a0" * 40)
    put("tokenizer_text", b"\xff\xfe invalid \xc3")


def cli_flags_seeds():
    lists = [
        ["--prompt", "a red circle", "--height", "32", "--width", "32", "--steps", "2", "--seed", "1", "--dtype",
         "f32", "--max-sequence-length", "16"],
        ["--prompt", "x", "--height", "1000000"],
        ["--prompt", "x", "--steps", "0"],
        ["--prompt", "x", "--negative-prompt", "y", "--guidance", "4.5", "--mode", "compile-blocks"],
        ["--prompt", "x", "--packed-weights", "12GiB", "--offload", "model", "--max-memory", "1.5TB"],
        ["--prompt", "x", "--offload", "group", "--blocks-per-group", "2", "--vae-tiling", "--vae-tile-size", "512"],
        ["--prompt", "x", "--guidance", "nan", "--seed", "-1", "--width", "1e5"],
        ["--prompt=x", "--prompt-2=y", "--height=64"],
        ["--prompt", "x", "--image", "/nonexistent.png", "--image", "/dev/null", "--steps", "4"],
        ["--prompt", "x", "--lora", "/nonexistent.safetensors:0.8", "--lora", "/dev/null:x:nan", "--fuse-lora"],
    ]
    for args in lists:
        put("cli_flags", "\0".join(args))


def lora_keys_seeds():
    """Every committed LoRA file's names, for the family it is for and for the others."""
    from safetensors import safe_open

    for f in sorted((DATA / "lora").glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            names = "\n".join(sf.keys())
        family = 1 if f.name.startswith("sd3") else 2 if f.name.startswith("flux2") else 0
        put("lora_keys", bytes([family]) + names.encode())
        put("lora_keys", bytes([(family + 1) % 3]) + names.encode())
    put("lora_keys", b"\x00lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight\nlora_unet_double_blocks_0_img_attn_qkv"
                     b".dora_scale\nlora_te2_encoder_block_0_q.lora_up.weight\ntransformer.x.lora_B.bias")


def lora_file_seeds():
    """Small LoRA files of every layout for the tiny pipelines (rank 1, float16), with alphas and metadata."""
    def pair(module, fan_in, fan_out, down=".lora_A.weight", up=".lora_B.weight", alpha=None):
        out = [(module + down, "F16", [1, fan_in], b"\x00\x3c" * fan_in),
               (module + up, "F16", [fan_out, 1], b"\x00\xb8" * fan_out)]
        if alpha is not None:
            out.append((module + ".alpha", "F32", [], struct.pack("<f", alpha)))
        return out

    kohya = dict(down=".lora_down.weight", up=".lora_up.weight")
    meta = {"lora_adapter_metadata": json.dumps({"transformer.lora_alpha": 2, "transformer.r": 1,
                                                 "transformer.alpha_pattern": {"proj_out": 4},
                                                 "transformer.use_rslora": True})}
    put("lora_file", safetensors_bytes(pair("transformer.transformer_blocks.0.attn.to_q", 32, 32, alpha=2.0) +
                                       pair("transformer.proj_out", 32, 64) +
                                       pair("text_encoder.text_model.encoder.layers.0.mlp.fc1", 32, 40), meta))
    put("lora_file", safetensors_bytes(pair("lora_unet_double_blocks_0_img_attn_qkv", 32, 96, alpha=0.5, **kohya) +
                                       pair("lora_unet_single_blocks_0_linear1", 32, 224, **kohya) +
                                       pair("lora_te1_text_model_encoder_layers_1_self_attn_out_proj", 32, 32, **kohya)))
    put("lora_file", safetensors_bytes(pair("diffusion_model.final_layer.adaLN_modulation.1", 32, 64) +
                                       pair("diffusion_model.single_blocks.1.linear2", 160, 32) +
                                       pair("diffusion_model.single_blocks.0.linear1", 32, 288)))
    put("lora_file", safetensors_bytes(pair("single_blocks.1.processor.proj_lora", 32, 32, ".down.weight", ".up.weight") +
                                       pair("double_blocks.0.processor.qkv_lora2", 32, 96, ".down.weight", ".up.weight")))
    put("lora_file", safetensors_bytes(pair("transformer.transformer_blocks.0.attn2.to_q", 32, 32) +
                                       pair("text_encoder_2.text_model.encoder.layers.2.mlp.fc2", 48, 32)))


def serve_request_seeds():
    bodies = [
        {"model": "flux-tiny-schnell", "prompt": "a red circle", "n": 1, "size": "32x32", "response_format": "b64_json",
         "seed": 1, "steps": 2, "guidance": 3.5, "max_sequence_length": 16},
        {"prompt": "x", "negative_prompt": "blurry", "prompt_2": "y", "size": "auto", "response_format": "url",
         "seed": 18446744073709551615, "quality": "hd", "style": "vivid", "user": "u", "output_format": "png",
         "stream": False},
        {"prompt": None},
        {"prompt": "x", "size": "1024x16385", "steps": 0, "n": 65},
        {"prompt": "x", "seed": -1, "guidance": 1e308, "max_sequence_length": 513},
        {"prompt": "x", "steps": 2.5, "n": "2", "size": 32},
        {"prompt": "x", "sead": 1},
        {"prompt": "\u00e9\U0001f408 caf\u00e9", "model": ""},
    ]
    for body in bodies:
        put("serve_request", json.dumps(body))
    put("serve_request", "[" * 20 + "]" * 20)
    put("serve_request", '{"prompt": [{"a": {"b": [1, 2, {"c": null}]}}]}')
    put("serve_request", b'{"prompt": "\xff\xfe"}')
    put("serve_request", '{"prompt": "x", "prompt": "y", "seed": 1e400}')
    put("serve_request", '{"prompt": "x"')


def trained_tokenizer_seeds():
    with tempfile.TemporaryDirectory() as workdir:
        model = small_sentencepiece(workdir)
        sentencepiece_seeds(model)
        tokenizer_json_seeds(model, workdir)


SEEDS = {
    "safetensors": [safetensors_seeds],
    "checkpoint_index": [checkpoint_index_seeds],
    "config_json": [config_json_seeds],
    "gguf": [gguf_seeds],
    "clip_bpe": [clip_bpe_seeds],
    "sentencepiece": [trained_tokenizer_seeds],
    "tokenizer_json": [trained_tokenizer_seeds, flux2_tokenizer_json_seeds],
    "tokenizer_text": [tokenizer_text_seeds],
    "regex": [regex_seeds],
    "png": [png_seeds],
    "cli_flags": [cli_flags_seeds],
    "lora_keys": [lora_keys_seeds],
    "lora_file": [lora_file_seeds],
    "serve_request": [serve_request_seeds],
}


def main():
    done = set()
    for target in sys.argv[1:] or SEEDS:
        for make in SEEDS[target]:
            if make not in done:
                done.add(make)
                make()
    for folder in sorted(CORPUS.iterdir()):
        files = list(folder.iterdir())
        print(f"{folder.name}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
