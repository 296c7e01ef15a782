"""The tokenizer test corpus: hand-picked hard cases plus strings generated
deterministically from a seed (scripts, emoji, whitespace runs, digits, code,
leading and trailing spaces, special tokens inside text, invalid UTF-8).

  python3 tokenizer_corpus.py [--seed S] [--count N] > corpus.jsonl

Each line is {"hex": <the string's bytes in hex>}; corpus() returns the bytes.
"""
import argparse
import json
import random

SPECIAL_TOKENS = [
    "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
    "<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|endoftext|>",
    "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|im_start|>",
]

WORDS = {
    "english": "the engine keeps serving when a device fails and recovers in milliseconds "
               "without losing a request once upon time there was little girl named Lily "
               "who loved play outside".split(),
    "german": "Straße Größe Übermäßig Fußgängerübergänge schön Mädchen".split(),
    "french": "élève où garçon déjà crème brûlée naïve".split(),
    "russian": "привет мир сервер устройство отказ быстро".split(),
    "greek": "Καλημέρα κόσμε Ωμέγα αλφάβητο".split(),
    "chinese": "你好 世界 服务器 设备 故障 恢复 日本語".split(),
    "japanese": "こんにちは カタカナ ひらがな 東京".split(),
    "korean": "안녕하세요 세계 서버".split(),
    "arabic": "مرحبا بالعالم الخادم".split(),
    "hebrew": "שלום עולם".split(),
    "hindi": "नमस्ते दुनिया सर्वर".split(),
    "thai": "สวัสดีชาวโลก".split(),
    "emoji": ["🚀", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "🧪", "✨", "🔥🔥"],
    "symbols": ["∑", "∞", "→", "©", "€", "£", "¥", "§", "µ", "°", "½", "™", "…", "—", "–"],
}
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "SELECT * FROM users WHERE id = 42;",
    "#include <vector>\nint main() { return 0; }",
    "if x != None and y >= 3:\n\tprint('ok')",
    "const f = async () => await fetch(url);",
    "    indented\n        more\n",
    "<div class=\"a\">&amp;</div>",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
]
WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0",
              "\u3000", "\u2009", "\u200b", "\f", "\v"]
HAND_PICKED = [
    "", " ", "  ", "\n", "\t", "a", " a", "a ", " a ", "Hello world", "Hello  world",
    "Hello   world", " Hello", "Hello ", "  leading and trailing  ", "\n\nnewlines\n\n",
    "tabs\tand\tmore\ttabs", "mixed \t \n whitespace", "line1\r\nline2\r\n",
    "1234567890", "3.14159265358979", "1,000,000", "-42", "0x1F", "2024-11-22", "v1.2.3",
    "100%", "$9.99", "a1b2c3", "ab12cd345ef6789",
    "Once upon a time, there was a little girl named Lily.",
    "The quick brown fox jumps over the lazy dog.",
    "don't can't won't it's I'm you're we've",
    "ALL CAPS TEXT", "MiXeD cAsE", "hyphen-ated and under_scored",
    "emoji 🚀 in text", "🚀🚀🚀", "👨‍👩‍👧‍👦 family", "flags 🇫🇷🇩🇪🇯🇵", "skin 👍🏻👍🏿",
    "日本語のテキスト", "中文文本测试", "한국어 텍스트", "Ελληνικά", "Русский текст",
    "עברית", "العربية", "हिन्दी", "ไทย", "Tiếng Việt", "Ñandú", "çà et là",
    "e\u0301 combining", "n\u0303", "A\u030a", "\u1e9b\u0323", "ﬁ ligature", "①②③",
    "zero\u200bwidth", "rtl \u202ehello\u202c", "bom \ufeff mark", "nbsp\u00a0here",
    "ideographic\u3000space", "\u2581 lower one eighth block", "▁▁▁", "a▁b",
    "<s>", "</s>", "<unk>", "<s>Hello", "Hello</s>", "Hi<s>there", "Hi <s> there",
    "[INST] Hello [/INST]", "[INST]Hello[/INST]", "<s>[INST] What is 2+2? [/INST]",
    "<|user|>\nHi<|end|>\n<|assistant|>", "a<|end|> b", "a <|end|>  b",
    "<|system|>\nYou are helpful.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>user\nHi<|im_end|>", "<<s>>", "<s<s>>", "</s></s>",
    "<0x41>", "<0xFF> literal", "\\n escaped", "quote \" and ' apostrophe",
    "\x00 nul", "\x01\x02\x03 controls", "\x7f del", "tab\x0bvt",
]
# Long runs and the far planes: BPE over one very long word, whitespace and
# digit runs longer than any vocabulary entry, "\r\n" runs, and code points
# from every plane (supplementary ideographs, mathematical letters, tags,
# private use, noncharacters, the replacement character).
EDGES = [
    "x" * 3000, "antidisestablishmentarianism" * 40, "日本" * 600, "🚀" * 400,
    " " * 257, "\t" * 100, "\n" * 130, "\r\n" * 80, " \n" * 60, "a" + " " * 100 + "b",
    "word" + " " * 33 + "\n" * 17 + "end", "0" * 300, "1234567890" * 25, "3" * 7 + "." + "1" * 9,
    "\U00010000\U00010400 linear b, deseret", "\U0001d400\U0001d401\U0001d7ff math",
    "\U00020000\U0002a6d6\U0002f800 CJK extension B", "\U000e0001\U000e0041\U000e007f tags",
    "\U000f0000\U000ffffd\U00100000\U0010fffd private use planes",
    "\ufffe\uffff\U0001fffe\U0010ffff noncharacters", "\ufffd replacement \ufffd\ufffd",
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f flag tag",
    "\U0001f469\u200d\U0001f4bb\u200d\U0001f525 zwj", "\u0915\u094d\u200d\u0937 zwj in devanagari",
    "a" + "\u0301" * 60, "\u202b\u05e9\u05dc\u05d5\u05dd\u202c \u2067x\u2069 isolates",
    "\u0000" * 5, "".join(chr(c) for c in range(1, 32)), "\u0085\u2028\u2029 line separators",
    "<|endoftext|" + ">", "<|endoftext|>" * 20, "<s" + ">" + "</s>" * 30, "[INST" + "]",
    "<0x00><0x0A>", "\u2581" * 50, " \u2581 " * 20,
]
INVALID_UTF8 = [
    b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe6\x97", b"\xe6\x97abc",
    b"\xf0\x9f\x9a", b"\xf0\x9f\x9a hi", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf",
    b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80", b"a\xffb\xfec", b"\x80\x80\x80",
    b"Hello \xe4\xb8 world", b"\xe4\xb8\xad\xe6", b"ok \xf0\x9f\x98\x80 then \xf0\x9f",
    b" \xc2 ", b"<s>\xff</s>", b"\xe2\x96", b"\xe2\x96\x81\xe2\x96",
]


def random_piece(rng):
    kind = rng.random()
    if kind < 0.45:
        script = rng.choice(list(WORDS))
        return rng.choice(WORDS[script])
    if kind < 0.55:
        return rng.choice(WHITESPACE) * rng.randint(1, 3)
    if kind < 0.65:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.72:
        return rng.choice(CODE)
    if kind < 0.80:
        return rng.choice(SPECIAL_TOKENS)
    if kind < 0.88:
        return rng.choice(".,;:!?()[]{}<>\"'-_/\\|@#$%^&*+=~`")
    if kind < 0.94:
        return "".join(chr(rng.randint(0x20, 0x7e)) for _ in range(rng.randint(1, 6)))
    return "".join(chr(rng.choice([rng.randint(0xa0, 0x2fff), rng.randint(0x3000, 0x9fff),
                                   rng.randint(0x1f300, 0x1faff)]))
                   for _ in range(rng.randint(1, 4)))


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        parts.append(random_piece(rng))
        r = rng.random()
        if r < 0.5:
            parts.append(" ")
        elif r < 0.6:
            parts.append(rng.choice(WHITESPACE))
    s = "".join(parts)
    if rng.random() < 0.15:
        s = " " * rng.randint(1, 3) + s
    if rng.random() < 0.15:
        s = s + " " * rng.randint(1, 3)
    b = s.encode("utf-8")
    if rng.random() < 0.05:  # a few invalid bytes inside
        at = rng.randint(0, len(b))
        b = b[:at] + rng.choice(INVALID_UTF8) + b[at:]
    return b


def corpus(seed=1, count=1000):
    fixed = HAND_PICKED + EDGES
    out = [s.encode("utf-8", "surrogatepass") for s in fixed] + list(INVALID_UTF8)
    rng = random.Random(seed)
    while len(out) < count + len(fixed) + len(INVALID_UTF8):
        out.append(random_string(rng))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=1000, help="generated strings (after the hand-picked)")
    a = p.parse_args()
    for b in corpus(a.seed, a.count):
        print(json.dumps({"hex": b.hex()}))


if __name__ == "__main__":
    main()
