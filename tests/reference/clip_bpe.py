"""A small CLIP byte-level BPE vocabulary, learnt from an embedded English corpus, plus a
pure-Python port of OpenAI CLIP's reference tokenizer (`simple_tokenizer.py`).

Used by make_tiny_diffusion.py to give the tiny Stable Diffusion fixtures a real (if small) CLIP
tokenizer: the real one has 49_408 entries and would dwarf the tiny models.

Vocabulary layout, exactly as CLIP builds its own (`simple_tokenizer.SimpleTokenizer.__init__`):
    ids 0..255          the 256 byte symbols of GPT-2's byte-to-unicode table, in that table's order
                        ('!' is id 0, as in the real vocab, so SD 2.x / SDXL's pad token "!" is id 0)
    ids 256..511        the same symbols followed by "</w>" (end-of-word forms)
    ids 512..512+M-1    the result of each merge, in merges.txt order
    then "<|startoftext|>" and "<|endoftext|>" (the last two ids; <|endoftext|> is the largest id,
    which CLIP's pooled-output rule "argmax of the ids" relies on)
merges.txt starts with a "#version: 0.2" line, then one "left right" pair per line.

Merges are learnt with plain BPE over the corpus words, pre-tokenised with CLIP's regex and
lower-cased; each word is split into byte symbols with "</w>" glued to its last symbol. At each step
the most frequent adjacent pair is merged (ties: the smallest pair in string order); a pair whose
merged string already exists is skipped so every vocabulary entry is unique.
"""

import html
import re
import unicodedata

import regex

CORPUS = """
A quiet valley at dawn, with mist over the river and tall pine trees on the hills. The morning light
turns the snow on the distant mountains pink and gold. A wooden cabin stands near the lake, smoke rising
from its chimney, and a small red boat rests on the shore.

The cat sleeps on the windowsill in the warm afternoon sun. It is a soft grey cat with green eyes and
white paws. Sometimes it watches the birds in the garden, sometimes it chases a ball of yarn across the
floor, and at night it curls up beside the fire.

The city at night is full of light and colour: neon signs in red, blue and purple, wet streets that
reflect the glow, people with umbrellas walking past cafes and shops. Tall glass towers rise above the
old brick buildings, and a train crosses the bridge over the dark river.

In the forest the path winds between old oak trees covered in moss. Ferns grow in the shade, mushrooms
hide under fallen leaves, and a fox watches from behind a rock. Rays of sunlight fall through the
branches and paint bright patches on the ground.

A portrait of an old man with a white beard, wearing a blue coat and a wide hat, painted in oil with
soft brush strokes. The background is a dark green wall with a golden frame. The painting is highly
detailed, with warm lighting and a calm, thoughtful mood.

The ocean is calm under a clear sky. Waves roll gently onto the sandy beach, where children build castles
and dogs run along the water. Far away, a white sailboat moves slowly towards the horizon, and seagulls
circle above the rocks.

Colours of the desert: orange sand dunes, a deep blue sky, a few green cacti and the long shadows of the
evening. A camel walks across the dunes while the sun sets behind the mountains, and the first stars
appear over the silent landscape.

A bowl of fresh fruit on a wooden table: red apples, yellow bananas, purple grapes and a bright orange.
The photo is sharp and realistic, with soft light from a window, a shallow depth of field and a blurry
background. A cup of coffee steams beside the bowl.

A dragon flies over a medieval castle in a fantasy landscape, its wings spread wide against a stormy sky.
Knights stand on the walls, banners wave in the wind, and lightning strikes the tower. Concept art,
digital painting, trending, dramatic lighting, very detailed, 4k, masterpiece.

Winter in the village: snow covers the roofs and the streets, children skate on the frozen pond, and
lights shine in every window. A red fox runs through the snow at the edge of the forest, leaving small
tracks behind it, while the moon rises over the hills.
"""

# CLIP's pre-tokeniser (simple_tokenizer.py; transformers' CLIPTokenizer uses the same pattern).
PAT = regex.compile(
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
    regex.IGNORECASE,
)
BOS = "<|startoftext|>"
EOS = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2 / CLIP byte-to-unicode table (dict from byte value to a printable character)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENCODER = bytes_to_unicode()


def clean(text):
    """CLIP's basic_clean + whitespace_clean + lower-casing. CLIP also runs ftfy.fix_text, whose
    effect on ordinary text is Unicode NFC normalisation (what transformers' tokenizer does too)."""
    text = unicodedata.normalize("NFC", text)
    text = html.unescape(html.unescape(text)).strip()
    text = re.sub(r"\s+", " ", text).strip()
    return text.lower()


def words_of(text):
    """Pre-tokenised words of `text`, each as a string of byte symbols."""
    return ["".join(BYTE_ENCODER[b] for b in tok.encode("utf-8")) for tok in PAT.findall(clean(text))]


def learn_merges(corpus, n_merges):
    counts = {}
    for w in words_of(corpus):
        counts[w] = counts.get(w, 0) + 1
    # each word as a list of symbols, "</w>" glued to the last one
    words = [(list(w[:-1]) + [w[-1] + "</w>"], c) for w, c in sorted(counts.items())]
    vocab = set(BYTE_ENCODER.values()) | {c + "</w>" for c in BYTE_ENCODER.values()}
    merges = []
    while len(merges) < n_merges:
        pairs = {}
        for syms, c in words:
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        candidates = sorted(((-c, p) for p, c in pairs.items() if p[0] + p[1] not in vocab))
        if not candidates:
            break
        best = candidates[0][1]
        merges.append(best)
        vocab.add(best[0] + best[1])
        for k, (syms, c) in enumerate(words):
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == best:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[k] = (out, c)
    return merges


def build_vocab(merges):
    tokens = list(BYTE_ENCODER.values())
    tokens += [t + "</w>" for t in tokens]
    tokens += [a + b for a, b in merges]
    tokens += [BOS, EOS]
    assert len(set(tokens)) == len(tokens)
    return {t: i for i, t in enumerate(tokens)}


def merges_text(merges):
    return "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)


class ReferenceClipTokenizer:
    """Port of OpenAI CLIP's simple_tokenizer.SimpleTokenizer (encode side) over a given vocab/merges."""

    def __init__(self, vocab, merges, extra_special=()):
        """`extra_special`: further special tokens (SD 2.x / SDXL's pad token "!"). transformers'
        CLIPTokenizer registers every special token as an added token and cuts it out of the text
        before BPE, so with pad_token "!" each "!" in a prompt becomes the bare "!" symbol (id 0)
        rather than taking part in BPE (where "!" at a word end would be "!</w>", id 256).
        OpenAI's tokenizer has no such step; this port follows transformers, i.e. diffusers."""
        self.encoder = vocab
        self.bpe_ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.cache = {BOS: BOS, EOS: EOS}
        self.extra_special = [t for t in extra_special if t not in (BOS, EOS)]

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        pairs = set(zip(word, word[1:]))
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = set(zip(word, word[1:]))
        out = " ".join(word)
        self.cache[token] = out
        return out

    def encode(self, text):
        """Token ids of `text` without BOS/EOS."""
        if self.extra_special:
            pieces = re.split("(" + "|".join(re.escape(t) for t in self.extra_special) + ")", text)
        else:
            pieces = [text]
        ids = []
        for piece in pieces:
            if piece in self.extra_special:
                ids.append(self.encoder[piece])
                continue
            for w in words_of(piece):
                ids.extend(self.encoder[t] for t in self.bpe(w).split(" "))
        return ids

    def pipeline_ids(self, text, pad_id, max_length=77):
        """What diffusers feeds the text encoder: BOS, at most max_length-2 tokens, EOS, then pad_id
        up to max_length (tokenizer(..., padding="max_length", truncation=True))."""
        ids = [self.encoder[BOS]] + self.encode(text)[: max_length - 2] + [self.encoder[EOS]]
        return ids + [pad_id] * (max_length - len(ids))
