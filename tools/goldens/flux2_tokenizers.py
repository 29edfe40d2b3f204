"""Tiny tokenizers with the structure of the real FLUX.2 ones, and the ids transformers gives on a prompt set.

    python3 tools/goldens/flux2_tokenizers.py

Writes, under tests/data/:
  models/flux2-tiny-text/dev/tokenizer/    Mistral-Small-3.1's folder layout (PixtralProcessor): tokenizer.json,
                                           tokenizer_config.json, special_tokens_map.json, processor_config.json,
                                           preprocessor_config.json, chat_template.json
  models/flux2-tiny-text/klein/tokenizer/  Qwen3's layout (Qwen2Tokenizer): tokenizer.json, tokenizer_config.json
                                           with the chat template, vocab.json, merges.txt
  tokenizers/tekken/                       the Mistral tokenizer with Tekken's own pattern (what transformers'
                                           MistralConverter builds from tekken.json, and what fix_mistral_regex
                                           installs)
  tokenizers/bpe_variants/{byte_fallback,behaviors}/tokenizer.json
                                           the BPE options and Split behaviours the FLUX.2 files do not use
                                           (byte_fallback, unk, fuse_unk; MergedWithPrevious/Next, Contiguous,
                                           invert, ByteLevel's GPT-2 regex and prefix space), with the
                                           `tokenizers` library's ids in tokenizer_ids.json under "variants"
  goldens/flux2_text/tokenizer_ids.json    per tokenizer: the ids of plain texts (no template), and the ids of
                                           the prompt set as diffusers' encode_prompt tokenizes them

The structures reproduce the real files' (see the report in docs/flux2_text.md for how each was checked):
  Mistral (tokenizer.json of Mistral-Small-3.1-24B-Instruct-2503, copied into FLUX.2-dev/tokenizer): normalizer
    null; pre_tokenizer Sequence[Split(cl100k-style regex, Isolated), ByteLevel(add_prefix_space=False,
    trim_offsets=True, use_regex=False)]; BPE with ignore_merges=True, byte_fallback=False, no unk; 1000 special
    tokens at ids 0..999 (here 32) before the byte-level vocabulary; post_processor TemplateProcessing "<s> $A".
  Qwen3 (Qwen3-4B/8B tokenizer.json): normalizer NFC; pre_tokenizer Sequence[Split(Qwen2 regex, Isolated),
    ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]; BPE (ignore_merges=False);
    post_processor ByteLevel; 26 added tokens after the vocabulary (<|endoftext|> first).
The vocabularies are small BPEs trained here with the `tokenizers` library on a mixed-script corpus.
"""
import json
import os
import random

from tokenizers import Tokenizer, models, pre_tokenizers, trainers, Regex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
DEV_TOKENIZER = os.path.join(DATA, "models", "flux2-tiny-text", "dev", "tokenizer")
KLEIN_TOKENIZER = os.path.join(DATA, "models", "flux2-tiny-text", "klein", "tokenizer")
TEKKEN_TOKENIZER = os.path.join(DATA, "tokenizers", "tekken")
GOLDENS = os.path.join(DATA, "goldens", "flux2_text")

# The pattern in Mistral-Small-3.1's tokenizer.json (the one transformers warns about: cl100k's, not Tekken's).
MISTRAL_SHIPPED_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Tekken's own pattern (tekken.json config.pattern; transformers' fix_mistral_regex installs it).
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
                  r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# Tekken's first special tokens (mistral_common's v7 table); the rest of the 1000 are <SPECIAL_i>.
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
                    "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
NUM_MISTRAL_SPECIALS = 32

# Qwen3's added tokens in id order (special: True for the first 14 and the vision ones, False for the tool/think
# tags), starting right after the BPE vocabulary.
QWEN_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
              ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
              ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
              ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True),
              ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
              ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
              ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
              ("</tool_response>", False), ("<think>", False), ("</think>", False)]

# The chat templates. Mistral-Small-3.1's (chat_template.json) takes the system message from the first message
# (a string or the first text block), wraps it in [SYSTEM_PROMPT]...[/SYSTEM_PROMPT] after bos_token, and each user
# message's text blocks in [INST]...[/INST] ([IMG] for image blocks). Qwen3's renders <|im_start|>role\ncontent
# <|im_end|>\n per message and, with add_generation_prompt, <|im_start|>assistant\n plus an empty think block when
# enable_thinking is false. Only the branches that diffusers' messages reach are kept (tools, assistant turns and
# reasoning content are left out); the rendered text for those messages is what the full templates render.
MISTRAL_TEMPLATE = """{%- set default_system_message = "You are Mistral Small 3.1, a Large Language Model (LLM) created by Mistral AI." %}
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content'] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                {%- endif %}
            {%- endfor %}
            {{- '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'system' %}
        {%- if message['content'] is string %}
            {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
        {%- else %}
            {{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {{- message['content'][0]['text'] + eos_token }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""

QWEN3_TEMPLATE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

PROMPTS = [
    "a cat",
    "A photo of a golden retriever surfing a wave at sunset, photorealistic, 8k",
    "Crème brûlée à la française, naïve café — Straße, Ærøskøbing, Ελληνικά",
    "e\u0301te\u0301 cafe\u0301 n\u0303 (combining marks)",
    "一只在海浪上冲浪的金毛猎犬，富士山の夜明け，서울의 밤",
    "🐶🏄\u200d♂️ surfing 🌊 👩🏽\u200d🚀 🇫🇷 ❤️",
    "tabs\tand\nnewlines\r\n  double  spaces\u00a0nbsp\u3000ideographic\u2028sep   ",
    "don't DON'T it's I'LL we'Ve y'all 'ſ O'Neil",
    "1234567 3.14159 2024-06-01 ½ ²³ ٣٤٥ ⅫⅦ",
    "McDonald's iPhone eBay NASA pH NaOH camelCaseWord",
    "[INST] injected [/INST] </s> <s> [IMG] image [SYSTEM_PROMPT] x <pad>",
    "<|im_start|>user<|im_end|> <think>maybe</think> <|endoftext|>",
    "",
    "   ",
    "Русский текст, עברית, العربية, हिन्दी, ภาษาไทย",
    "path/to/file.png -- a // b ... !!! ??? «quotes» “curly”",
    ("a very long prompt about a lighthouse on a cliff above a stormy sea, with waves crashing, seagulls, dramatic "
     "clouds, volumetric light, cinematic composition, 35mm film grain, highly detailed, award winning ") * 6,
]
# The last one: letters of Unicode 15.0 (Kawi U+11F04, CJK Ext H U+31350) and 16.0 (Ol Onal U+1E5D0), and a
# Unicode 15.0 spacing mark (U+0CF3), which Oniguruma classifies by its newer tables.
PLAIN_TEXTS = PROMPTS + ["Hello world", " leading space", "trailing space ", "\n\n\nnewlines only\n",
                         "x" * 300, "ab" * 50 + " " + "123" * 20,
                         "a\U00011F04b \U00031350x \U0001E5D0\U0001E5D1 \u0CF3z"]


def corpus():
    rng = random.Random(0)
    base = [
        "a photo of a cat sitting on a windowsill in the morning light",
        "the quick brown fox jumps over the lazy dog",
        "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
        "relationships, object attribution and actions without speculation.",
        "golden retriever surfing a wave at sunset, photorealistic, highly detailed, cinematic lighting",
        "a lighthouse on a cliff above a stormy sea with dramatic clouds",
        "crème brûlée, café au lait, naïve, Straße, Ærøskøbing, façade, señor, jalapeño",
        "一只猫坐在窗台上，早晨的阳光，富士山の夜明け，서울의 밤거리",
        "Русский текст и немного кириллицы, Ελληνικά γράμματα, עברית, العربية",
        "don't won't it's I'll we've they're you'd she's",
        "1234567890 3.14 2024-06-01 100% 42",
        "McDonald's iPhone eBay NASA camelCase snake_case kebab-case",
        "🐶 🌊 🏄 ❤️ 🇫🇷 👩🏽‍🚀",
        "path/to/file.png -- a // b ... !!! ??? «quotes» “curly”",
        "\tindented\n\nnew paragraph\r\n  two spaces",
    ]
    words = " ".join(base).split()
    lines = list(base) * 20
    for _ in range(400):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
    return lines


def train_byte_level_bpe(pattern, vocab_size, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], model["merges"]


def added_token(i, content, special):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def mistral_tokenizer_json(pattern):
    vocab, merges = train_byte_level_bpe(pattern, 900)
    specials = MISTRAL_SPECIALS + ["<SPECIAL_%d>" % i for i in range(len(MISTRAL_SPECIALS), NUM_MISTRAL_SPECIALS)]
    full_vocab = {s: i for i, s in enumerate(specials)}
    for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        full_vocab[tok] = NUM_MISTRAL_SPECIALS + i
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(i, s, True) for i, s in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": full_vocab, "merges": merges},
    }


def write_mistral_folder(dst, pattern):
    os.makedirs(dst, exist_ok=True)
    tj = mistral_tokenizer_json(pattern)
    Tokenizer.from_str(json.dumps(tj))  # the tokenizers library must accept it
    json.dump(tj, open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    specials = [t["content"] for t in tj["added_tokens"]]
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "add_prefix_space": None,
        "added_tokens_decoder": {str(i): {k: v for k, v in added_token(i, s, True).items() if k != "id"}
                                 for i, s in enumerate(specials)},
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "extra_special_tokens": {},
        "legacy": True,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<pad>",
        "processor_class": "PixtralProcessor",
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    json.dump(config, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=2)
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
              open(os.path.join(dst, "special_tokens_map.json"), "w"), indent=2)
    json.dump({"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
               "patch_size": 14, "processor_class": "PixtralProcessor", "spatial_merge_size": 2},
              open(os.path.join(dst, "processor_config.json"), "w"), indent=2)
    json.dump({"crop_size": None, "data_format": "channels_first", "default_to_square": True, "device": None,
               "do_center_crop": None, "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
               "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
               "image_processor_type": "PixtralImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
               "patch_size": {"height": 14, "width": 14}, "processor_class": "PixtralProcessor", "resample": 3,
               "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}},
              open(os.path.join(dst, "preprocessor_config.json"), "w"), indent=2)
    json.dump({"chat_template": MISTRAL_TEMPLATE}, open(os.path.join(dst, "chat_template.json"), "w"), indent=2)


def write_qwen_folder(dst):
    from tokenizers import normalizers
    os.makedirs(dst, exist_ok=True)
    vocab, merges = train_byte_level_bpe(QWEN_PATTERN, 900, normalizers.NFC())
    n = len(vocab)
    added = [added_token(n + i, s, special) for i, (s, special) in enumerate(QWEN_ADDED)]
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    Tokenizer.from_str(json.dumps(tj))
    json.dump(tj, open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump(vocab, open(os.path.join(dst, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
    with open(os.path.join(dst, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) if isinstance(m, list) else m for m in merges) + "\n")
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
        "additional_special_tokens": [s for s, special in QWEN_ADDED[1:14]],
        "bos_token": None,
        "chat_template": QWEN3_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    json.dump(config, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=2)


def mistral_cases(processor, max_lengths):
    # Exactly the calls of Flux2Pipeline._get_mistral_3_small_prompt_embeds.
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    out = []
    for max_length in max_lengths:
        messages = format_input(prompts=PROMPTS, system_message=SYSTEM_MESSAGE)
        inputs = processor.apply_chat_template(messages, add_generation_prompt=False, tokenize=True,
                                               return_dict=True, return_tensors="pt", padding="max_length",
                                               truncation=True, max_length=max_length)
        rendered = processor.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
        for i, prompt in enumerate(PROMPTS):
            out.append({"prompt": prompt, "max_length": max_length, "rendered": rendered[i],
                        "input_ids": inputs["input_ids"][i].tolist(),
                        "attention_mask": inputs["attention_mask"][i].tolist()})
    return out


def qwen_cases(tokenizer, max_lengths):
    # Exactly the calls of Flux2KleinPipeline._get_qwen3_prompt_embeds.
    out = []
    for max_length in max_lengths:
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 enable_thinking=False)
            inputs = tokenizer(text, return_tensors="pt", padding="max_length", truncation=True,
                               max_length=max_length)
            out.append({"prompt": prompt, "max_length": max_length, "rendered": text,
                        "input_ids": inputs["input_ids"][0].tolist(),
                        "attention_mask": inputs["attention_mask"][0].tolist()})
    return out


def plain(tokenizer):
    return [{"text": t, "ids": tokenizer(t, add_special_tokens=False)["input_ids"],
             "ids_with_specials": tokenizer(t)["input_ids"]} for t in PLAIN_TEXTS]


def write_variants():
    from tokenizers import normalizers
    out = {}
    # Byte fallback for characters outside the vocabulary, the unk token (fused) when a byte is missing too.
    vocab = {"<unk>": 0}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
    for b in [0xC3, 0xA9, 0xE2, 0x82, 0xAC]:
        vocab["<0x%02X>" % b] = len(vocab)
    merges = [("a", "b"), ("ab", "c"), ("t", "h"), ("th", "e")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    fallback = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    fallback.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")
    # The other Split behaviours and ByteLevel's own GPT-2 split with a prefix space, after a Lowercase normalizer.
    vocab, merges = train_byte_level_bpe(QWEN_PATTERN, 400)
    behaviors = Tokenizer(models.BPE(vocab, [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]))
    behaviors.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])
    behaviors.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(",", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[0-9]"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[aeiou]+"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    texts = ["abc the é € ABC", "日本語 ok", "é€日abcabc", "well-known, co-op,,x 2024-06-01 12ab34",
             "Crème Brûlée---done", "", "   ", "a,b-c,-d"]
    for name, tok in (("byte_fallback", fallback), ("behaviors", behaviors)):
        folder = os.path.join(DATA, "tokenizers", "bpe_variants", name)
        os.makedirs(folder, exist_ok=True)
        tok.save(os.path.join(folder, "tokenizer.json"))
        out[name] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    return out


def main():
    from transformers import AutoProcessor, AutoTokenizer
    write_mistral_folder(DEV_TOKENIZER, MISTRAL_SHIPPED_PATTERN)
    write_mistral_folder(TEKKEN_TOKENIZER, TEKKEN_PATTERN)
    write_qwen_folder(KLEIN_TOKENIZER)

    # As diffusers loads them: AutoProcessor for Flux2Pipeline's tokenizer, the tokenizer class for klein's.
    processor = AutoProcessor.from_pretrained(DEV_TOKENIZER)
    tekken = AutoProcessor.from_pretrained(TEKKEN_TOKENIZER)
    qwen = AutoTokenizer.from_pretrained(KLEIN_TOKENIZER)
    print("mistral:", type(processor).__name__, type(processor.tokenizer).__name__,
          processor.tokenizer.padding_side, "| qwen:", type(qwen).__name__, qwen.padding_side)
    refs = {
        "mistral": {"padding_side": processor.tokenizer.padding_side, "plain": plain(processor.tokenizer),
                    "prompts": mistral_cases(processor, [512, 40])},
        "tekken": {"padding_side": tekken.tokenizer.padding_side, "plain": plain(tekken.tokenizer),
                   "prompts": mistral_cases(tekken, [512])},
        "qwen3": {"padding_side": qwen.padding_side, "plain": plain(qwen), "prompts": qwen_cases(qwen, [512, 24])},
        "variants": write_variants(),
    }
    os.makedirs(GOLDENS, exist_ok=True)
    with open(os.path.join(GOLDENS, "tokenizer_ids.json"), "w", encoding="utf-8") as f:
        json.dump(refs, f, ensure_ascii=False, separators=(",", ":"))
    for name, r in refs.items():
        if name == "variants":
            continue
        n_tokens = [sum(c["attention_mask"]) for c in r["prompts"]]
        print(name, "prompt lengths", n_tokens)


if __name__ == "__main__":
    main()
